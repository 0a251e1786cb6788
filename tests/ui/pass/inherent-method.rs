//! Methods: `&self`, `&mut self`, `self` and `self: Arc<Self>` receivers, `<self.field>` keys.
#![deny(warnings)]

use std::sync::Arc;

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError(pub LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

pub struct Account {
    pub tenant: String,
    pub id: (u32, u64),
    pub balance: u64,
}

impl Account {
    #[distributed_lock(key = "account:<self.tenant>:<self.id.1>")]
    pub async fn balance(&self) -> Result<u64, AppError> {
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.tenant>:<self.id.1>", wait = "1s")]
    pub async fn deposit(&mut self, amount: u64) -> Result<u64, AppError> {
        self.balance += amount;
        Ok(self.balance)
    }

    /// The key is rendered from a borrow before the body runs, so the body may consume `self`.
    #[distributed_lock(key = "account:<self.tenant>:<self.id.1>")]
    pub async fn close(self) -> Result<u64, AppError> {
        let Account { balance, .. } = self;
        Ok(balance)
    }

    #[distributed_lock(key = "account:<self.tenant>:<self.id.0>:<region>")]
    pub async fn shared(self: Arc<Self>, region: &str) -> Result<usize, AppError> {
        Ok(self.tenant.len() + region.len())
    }

    /// An associated fn without a receiver names its parameters only.
    #[distributed_lock(key = "account:<tenant>")]
    pub async fn open(tenant: String) -> Result<Account, AppError> {
        Ok(Account {
            tenant,
            id: (0, 0),
            balance: 0,
        })
    }
}

fn main() {
    let mut account = Account {
        tenant: "acme".into(),
        id: (1, 2),
        balance: 3,
    };
    drop(account.balance());
    drop(account.deposit(4));
    drop(
        Arc::new(Account {
            tenant: "acme".into(),
            id: (1, 2),
            balance: 3,
        })
        .shared("eu"),
    );
    drop(account.close());
    drop(Account::open("acme".into()));
}
