use distlock::distributed_lock;

#[derive(Debug)]
pub struct PlainError;

#[distributed_lock(key = "job:<id>")]
async fn run(id: u64) -> Result<u64, PlainError> {
    let doubled = id * 2;
    let tripled = doubled + id;
    Ok(tripled)
}

fn main() {}
