use distlock::distributed_lock;

/// An alias whose hidden error type cannot hold a lock failure.
pub type Result<T> = std::result::Result<T, String>;

#[distributed_lock(key = "job:<id>")]
async fn run(id: u64) -> Result<u64> {
    Ok(id)
}

fn main() {}
