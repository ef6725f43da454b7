//! An in-process NVMe controller for the driver's hermetic tests: registers (CAP, VS, CC,
//! CSTS, AQA, ASQ, ACQ), doorbells, admin (Identify controller/namespace/active list, Set
//! and Get Features Number of Queues, Create/Delete I/O CQ/SQ, Get Log Page 02h, Abort)
//! and NVM commands (Read, Write, Flush, Write Zeroes, Dataset Management/deallocate)
//! over PRPs (with chained PRP lists) and single SGL Data Block descriptors.
//!
//! Commands run synchronously when their SQ tail doorbell is written; completions wait
//! for CQ space. Fault injection: held ("stuck") commands, a hung controller, an admin
//! queue that stops answering, Abort that does nothing, a slow CSTS.RDY after enable,
//! injected error statuses, a function reset behind the driver's back, surprise removal
//! (all-ones reads), orderly removal requests, and a panic in the doorbell write that
//! submits a given admin command. It counts DMA memory freed while one of its I/O queues
//! still lies in it (`EmuCounters::freed_under_device`).
//!
//! Not emulated: interrupts (the driver polls), metadata, namespaces management,
//! fused commands, Compare, controller memory buffers, multiple SGL descriptors.

mod ctrl;
mod dma;

pub use ctrl::{EmuConfig, EmuCounters, EmulatedController};
