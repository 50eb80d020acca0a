//! The accelerator's device interface: Intel IAA work queues through their
//! documented user interface. The codec that uses them, `deflate-iaa`, is
//! [`crate::codec::IaaCodec`]; nothing here knows about codecs.
//!
//! - [`desc`]: the 64-byte descriptor and completion record of
//!   `include/uapi/linux/idxd.h`, opcodes, flags and status codes.
//! - [`sysfs`]: discovery of enabled user-type IAA work queues.
//! - [`portal`]: submission (MOVDIR64B, ENQCMD, `write()`) behind the
//!   [`portal::Submitter`] trait.
//! - [`router`]: the process-wide set of open work queues.
//! - `model` (cargo feature `test-support`): a software IAA device the
//!   tests run the backend against; it is a test double, not shipped.
//!
//! The hardware path is verified against the model only: no machine this
//! was developed on has an IAA device.

pub mod desc;
#[cfg(feature = "test-support")]
pub mod model;
pub mod portal;
pub mod router;
pub mod sysfs;

#[cfg(any(test, feature = "test-support"))]
pub use router::{Router, WorkQueue};
