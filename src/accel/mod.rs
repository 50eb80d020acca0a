//! Routing compression to accelerator work queues: Intel IAA through its
//! documented user interface, with the software codec everywhere else.
//!
//! - [`desc`]: the 64-byte descriptor and completion record of
//!   `include/uapi/linux/idxd.h`, opcodes, flags and status codes.
//! - [`sysfs`]: discovery of enabled user-type IAA work queues.
//! - [`portal`]: submission (MOVDIR64B, ENQCMD, `write()`) behind the
//!   [`portal::Submitter`] trait.
//! - [`router`]: the process-wide set of open work queues.
//! - [`iaa`]: [`IaaCodec`], the `deflate-iaa` codec.
//! - [`model`]: a software IAA device the tests run the backend against.
//!
//! The hardware path is verified against [`model`] only: no machine this
//! was developed on has an IAA device.

pub mod desc;
pub mod iaa;
pub mod model;
pub mod portal;
pub mod router;
pub mod sysfs;

pub use iaa::{IaaCodec, IaaOptions, IaaStats};
pub use router::{Router, WorkQueue};
