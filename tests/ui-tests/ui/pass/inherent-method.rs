//! Methods: `&self`, `&mut self`, `self` and `self: Arc<Self>` receivers, `<self.field>` keys.
//! Each call runs on the in-process backend and checks, inside its body, which key it holds.
#![deny(warnings)]

use std::sync::Arc;

use distlock::{distributed_lock, LockError};

#[path = "../support/in_process.rs"]
mod in_process;
use in_process::assert_holds;

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
        assert_holds("account:acme:2").await;
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.tenant>:<self.id.1>", wait = "1s")]
    pub async fn deposit(&mut self, amount: u64) -> Result<u64, AppError> {
        assert_holds("account:acme:2").await;
        self.balance += amount;
        Ok(self.balance)
    }

    /// The key is rendered from a borrow before the body runs, so the body may consume `self`.
    #[distributed_lock(key = "account:<self.tenant>:<self.id.1>")]
    pub async fn close(self) -> Result<u64, AppError> {
        assert_holds("account:acme:2").await;
        let Account { balance, .. } = self;
        Ok(balance)
    }

    #[distributed_lock(key = "account:<self.tenant>:<self.id.0>:<region>")]
    pub async fn shared(self: Arc<Self>, region: &str) -> Result<usize, AppError> {
        assert_holds("account:acme:1:eu").await;
        Ok(self.tenant.len() + region.len())
    }

    /// An associated fn without a receiver names its parameters only.
    #[distributed_lock(key = "account:<tenant>")]
    pub async fn open(tenant: String) -> Result<Account, AppError> {
        assert_holds("account:acme").await;
        Ok(Account {
            tenant,
            id: (0, 0),
            balance: 0,
        })
    }
}

fn main() {
    in_process::run("default", |_| async {
        let mut account = Account {
            tenant: "acme".into(),
            id: (1, 2),
            balance: 3,
        };
        assert_eq!(account.balance().await.unwrap(), 3);
        assert_eq!(account.deposit(4).await.unwrap(), 7);
        let shared = Arc::new(Account {
            tenant: "acme".into(),
            id: (1, 2),
            balance: 3,
        });
        assert_eq!(shared.shared("eu").await.unwrap(), 6);
        assert_eq!(account.close().await.unwrap(), 7);
        assert_eq!(Account::open("acme".into()).await.unwrap().balance, 0);
    });
}
