//! placeholder
#[derive(Debug)]
pub struct IoBuf;
#[derive(Debug)]
pub struct BufPool;
