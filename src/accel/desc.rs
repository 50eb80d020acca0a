//! The IAA descriptor and completion record, byte for byte as in Linux's
//! `include/uapi/linux/idxd.h` (`struct iax_hw_desc`,
//! `struct iax_completion_record`), with the opcodes, flags and status codes
//! the compress/decompress path uses.
//!
//! Both structs are `repr(C)` with every field at its natural alignment, so
//! the Rust layout equals the packed C layout; compile-time asserts below pin
//! every offset. [`IaxHwDesc::to_bytes`] encodes little-endian explicitly
//! (the device's byte order), and [`IaxHwDesc::from_bytes`] is what the
//! software model uses to parse what the backend submitted.

use std::mem::{align_of, offset_of, size_of};

/// Size of a descriptor and of a completion record, in bytes.
pub const DESC_SIZE: usize = 64;

/// `IAX_OPCODE_DECOMPRESS`.
pub const IAX_OPCODE_DECOMPRESS: u8 = 0x42;
/// `IAX_OPCODE_COMPRESS`.
pub const IAX_OPCODE_COMPRESS: u8 = 0x43;

/// `IDXD_OP_FLAG_CRAV`: the completion record address is valid.
pub const IDXD_OP_FLAG_CRAV: u32 = 0x0004;
/// `IDXD_OP_FLAG_RCR`: request a completion record.
pub const IDXD_OP_FLAG_RCR: u32 = 0x0008;
/// `IDXD_OP_FLAG_CC`: cache control (write output to cache, not memory).
pub const IDXD_OP_FLAG_CC: u32 = 0x0100;
/// `IDXD_OP_FLAG_RD_SRC2_AECS`: src2 points at an AECS to read.
pub const IDXD_OP_FLAG_RD_SRC2_AECS: u32 = 0x01_0000;

/// `IAA_COMP_FLUSH_OUTPUT` (iaa_crypto.h).
pub const IAA_COMP_FLUSH_OUTPUT: u16 = 1 << 1;
/// `IAA_COMP_APPEND_EOB` (iaa_crypto.h).
pub const IAA_COMP_APPEND_EOB: u16 = 1 << 2;
/// `IAA_DECOMP_ENABLE` (iaa_crypto.h).
pub const IAA_DECOMP_ENABLE: u16 = 1 << 0;
/// `IAA_DECOMP_FLUSH_OUTPUT` (iaa_crypto.h).
pub const IAA_DECOMP_FLUSH_OUTPUT: u16 = 1 << 1;
/// `IAA_DECOMP_CHECK_FOR_EOB` (iaa_crypto.h).
pub const IAA_DECOMP_CHECK_FOR_EOB: u16 = 1 << 2;
/// `IAA_DECOMP_STOP_ON_EOB` (iaa_crypto.h).
pub const IAA_DECOMP_STOP_ON_EOB: u16 = 1 << 3;
/// `IAA_DECOMP_SUPPRESS_OUTPUT` (iaa_crypto.h): decode, compute the CRC,
/// write nothing (used to verify a compression).
pub const IAA_DECOMP_SUPPRESS_OUTPUT: u16 = 1 << 9;

/// Descriptor flags for a compress, as iaa_crypto sets them.
pub const COMPRESS_DESC_FLAGS: u32 =
    IDXD_OP_FLAG_CRAV | IDXD_OP_FLAG_RCR | IDXD_OP_FLAG_RD_SRC2_AECS | IDXD_OP_FLAG_CC;
/// Descriptor flags for a decompress, as iaa_crypto sets them.
pub const DECOMPRESS_DESC_FLAGS: u32 = IDXD_OP_FLAG_CRAV | IDXD_OP_FLAG_RCR | IDXD_OP_FLAG_CC;
/// `IAA_COMP_FLAGS`.
pub const IAA_COMP_FLAGS: u16 = IAA_COMP_FLUSH_OUTPUT | IAA_COMP_APPEND_EOB;
/// `IAA_DECOMP_FLAGS`.
pub const IAA_DECOMP_FLAGS: u16 =
    IAA_DECOMP_ENABLE | IAA_DECOMP_FLUSH_OUTPUT | IAA_DECOMP_CHECK_FOR_EOB | IAA_DECOMP_STOP_ON_EOB;

/// `IAX_COMP_NONE`: the record has not been written yet.
pub const IAX_COMP_NONE: u8 = 0x00;
/// `IAX_COMP_SUCCESS`.
pub const IAX_COMP_SUCCESS: u8 = 0x01;
/// `IAX_COMP_PAGE_FAULT_IR`: a page fault the device could not resolve.
pub const IAX_COMP_PAGE_FAULT_IR: u8 = 0x04;
/// `IAX_COMP_ANALYTICS_ERROR` (`IAA_ANALYTICS_ERROR`): see `error_code`.
pub const IAX_COMP_ANALYTICS_ERROR: u8 = 0x0a;
/// `IAX_COMP_OUTBUF_OVERFLOW` (`IAA_ERROR_DECOMP_BUF_OVERFLOW`).
#[cfg(any(test, feature = "test-support"))]
pub const IAX_COMP_OUTBUF_OVERFLOW: u8 = 0x0b;
/// `IAX_COMP_BAD_OPCODE`.
#[cfg(any(test, feature = "test-support"))]
pub const IAX_COMP_BAD_OPCODE: u8 = 0x10;
/// `IAX_COMP_INVALID_FLAGS`.
#[cfg(any(test, feature = "test-support"))]
pub const IAX_COMP_INVALID_FLAGS: u8 = 0x11;
/// `IAX_COMP_INVALID_SIZE`.
#[cfg(any(test, feature = "test-support"))]
pub const IAX_COMP_INVALID_SIZE: u8 = 0x13;
/// `IAA_ERROR_WATCHDOG_EXPIRED`.
#[cfg(any(test, feature = "test-support"))]
pub const IAA_ERROR_WATCHDOG_EXPIRED: u8 = 0x24;
/// `IAA_ERROR_COMP_BUF_OVERFLOW`: `error_code` of an analytics error when a
/// compression does not fit in `max_dst_size`.
pub const IAA_ERROR_COMP_BUF_OVERFLOW: u8 = 0x19;
/// `DSA_COMP_STATUS_MASK`: bit 7 of `status` is the "record written" bit.
pub const COMP_STATUS_MASK: u8 = 0x7f;

/// `struct iax_hw_desc`: one 64-byte IAA work descriptor.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IaxHwDesc {
    /// `pasid:20`, `rsvd:11`, `priv:1` (bits 0-19, 20-30, 31).
    pub pasid_priv: u32,
    /// `flags:24` (bits 0-23) and `opcode:8` (bits 24-31).
    pub flags_opcode: u32,
    /// `completion_addr`: a 64-byte-aligned completion record.
    pub completion_addr: u64,
    /// `src1_addr`: input.
    pub src1_addr: u64,
    /// `dst_addr`: output.
    pub dst_addr: u64,
    /// `src1_size`: input length in bytes.
    pub src1_size: u32,
    /// `int_handle`: interrupt handle (unused: completions are polled).
    pub int_handle: u16,
    /// `compr_flags` / `decompr_flags` (a union in C).
    pub op_flags: u16,
    /// `src2_addr`: for a compress, the AECS holding the Huffman tables.
    pub src2_addr: u64,
    /// `max_dst_size`: output buffer length.
    pub max_dst_size: u32,
    /// `src2_size`: length of what `src2_addr` points at.
    pub src2_size: u32,
    /// `filter_flags` (analytics only; zero here).
    pub filter_flags: u32,
    /// `num_inputs` (analytics only; zero here).
    pub num_inputs: u32,
}

const _: () = {
    assert!(size_of::<IaxHwDesc>() == DESC_SIZE);
    assert!(align_of::<IaxHwDesc>() == 64);
    assert!(offset_of!(IaxHwDesc, pasid_priv) == 0);
    assert!(offset_of!(IaxHwDesc, flags_opcode) == 4);
    assert!(offset_of!(IaxHwDesc, completion_addr) == 8);
    assert!(offset_of!(IaxHwDesc, src1_addr) == 16);
    assert!(offset_of!(IaxHwDesc, dst_addr) == 24);
    assert!(offset_of!(IaxHwDesc, src1_size) == 32);
    assert!(offset_of!(IaxHwDesc, int_handle) == 36);
    assert!(offset_of!(IaxHwDesc, op_flags) == 38);
    assert!(offset_of!(IaxHwDesc, src2_addr) == 40);
    assert!(offset_of!(IaxHwDesc, max_dst_size) == 48);
    assert!(offset_of!(IaxHwDesc, src2_size) == 52);
    assert!(offset_of!(IaxHwDesc, filter_flags) == 56);
    assert!(offset_of!(IaxHwDesc, num_inputs) == 60);
};

/// Reads a little-endian integer of `N` bytes at `at` (the caller's
/// offsets are constants inside a 64-byte array, so the slice always fits).
#[cfg(any(test, feature = "test-support"))]
fn le<const N: usize>(b: &[u8; DESC_SIZE], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}

impl IaxHwDesc {
    /// A descriptor with `opcode` and 24-bit descriptor `flags` set, every
    /// other field zero (PASID 0: the kernel fills the PASID of a user WQ).
    pub fn new(opcode: u8, flags: u32) -> Self {
        IaxHwDesc {
            flags_opcode: (flags & 0x00ff_ffff) | (u32::from(opcode) << 24),
            ..Default::default()
        }
    }

    /// The opcode (bits 24-31 of the second dword).
    #[cfg(any(test, feature = "test-support"))]
    pub fn opcode(&self) -> u8 {
        (self.flags_opcode >> 24) as u8
    }

    /// The 24 descriptor flag bits.
    #[cfg(any(test, feature = "test-support"))]
    pub fn flags(&self) -> u32 {
        self.flags_opcode & 0x00ff_ffff
    }

    /// The descriptor's 64 bytes as the device reads them (little-endian).
    pub fn to_bytes(&self) -> [u8; DESC_SIZE] {
        let mut b = [0u8; DESC_SIZE];
        b[0..4].copy_from_slice(&self.pasid_priv.to_le_bytes());
        b[4..8].copy_from_slice(&self.flags_opcode.to_le_bytes());
        b[8..16].copy_from_slice(&self.completion_addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.src1_addr.to_le_bytes());
        b[24..32].copy_from_slice(&self.dst_addr.to_le_bytes());
        b[32..36].copy_from_slice(&self.src1_size.to_le_bytes());
        b[36..38].copy_from_slice(&self.int_handle.to_le_bytes());
        b[38..40].copy_from_slice(&self.op_flags.to_le_bytes());
        b[40..48].copy_from_slice(&self.src2_addr.to_le_bytes());
        b[48..52].copy_from_slice(&self.max_dst_size.to_le_bytes());
        b[52..56].copy_from_slice(&self.src2_size.to_le_bytes());
        b[56..60].copy_from_slice(&self.filter_flags.to_le_bytes());
        b[60..64].copy_from_slice(&self.num_inputs.to_le_bytes());
        b
    }

    /// Parses 64 descriptor bytes (what a device does with a submission).
    #[cfg(any(test, feature = "test-support"))]
    pub fn from_bytes(b: &[u8; DESC_SIZE]) -> Self {
        IaxHwDesc {
            pasid_priv: u32::from_le_bytes(le(b, 0)),
            flags_opcode: u32::from_le_bytes(le(b, 4)),
            completion_addr: u64::from_le_bytes(le(b, 8)),
            src1_addr: u64::from_le_bytes(le(b, 16)),
            dst_addr: u64::from_le_bytes(le(b, 24)),
            src1_size: u32::from_le_bytes(le(b, 32)),
            int_handle: u16::from_le_bytes(le(b, 36)),
            op_flags: u16::from_le_bytes(le(b, 38)),
            src2_addr: u64::from_le_bytes(le(b, 40)),
            max_dst_size: u32::from_le_bytes(le(b, 48)),
            src2_size: u32::from_le_bytes(le(b, 52)),
            filter_flags: u32::from_le_bytes(le(b, 56)),
            num_inputs: u32::from_le_bytes(le(b, 60)),
        }
    }
}

/// `struct iax_completion_record`: written by the device when a descriptor
/// finishes; `status` is written last and polled until non-zero.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IaxCompletionRecord {
    /// `status` (`volatile` in C): 0 until the device writes the record.
    pub status: u8,
    /// `error_code`: detail of an analytics error.
    pub error_code: u8,
    /// `fault_info`: read/write and other details of a page fault.
    pub fault_info: u8,
    /// `rsvd`.
    pub rsvd: u8,
    /// `bytes_completed`: input consumed before a fault.
    pub bytes_completed: u32,
    /// `fault_addr`: the faulting address.
    pub fault_addr: u64,
    /// `invalid_flags`: which descriptor flags were rejected.
    pub invalid_flags: u32,
    /// `rsvd2`.
    pub rsvd2: u32,
    /// `output_size`: bytes written to `dst_addr`.
    pub output_size: u32,
    /// `output_bits`: valid bits in the last output byte (0: all).
    pub output_bits: u8,
    /// `rsvd3`.
    pub rsvd3: u8,
    /// `xor_csum`.
    pub xor_csum: u16,
    /// `crc`: CRC-32 of the uncompressed data (input of a compress, output
    /// of a decompress).
    pub crc: u32,
    /// `min` (analytics).
    pub min: u32,
    /// `max` (analytics).
    pub max: u32,
    /// `sum` (analytics).
    pub sum: u32,
    /// `rsvd4[2]`.
    pub rsvd4: [u64; 2],
}

const _: () = {
    assert!(size_of::<IaxCompletionRecord>() == DESC_SIZE);
    assert!(align_of::<IaxCompletionRecord>() == 64);
    assert!(offset_of!(IaxCompletionRecord, status) == 0);
    assert!(offset_of!(IaxCompletionRecord, error_code) == 1);
    assert!(offset_of!(IaxCompletionRecord, fault_info) == 2);
    assert!(offset_of!(IaxCompletionRecord, bytes_completed) == 4);
    assert!(offset_of!(IaxCompletionRecord, fault_addr) == 8);
    assert!(offset_of!(IaxCompletionRecord, invalid_flags) == 16);
    assert!(offset_of!(IaxCompletionRecord, output_size) == 24);
    assert!(offset_of!(IaxCompletionRecord, output_bits) == 28);
    assert!(offset_of!(IaxCompletionRecord, xor_csum) == 30);
    assert!(offset_of!(IaxCompletionRecord, crc) == 32);
    assert!(offset_of!(IaxCompletionRecord, min) == 36);
    assert!(offset_of!(IaxCompletionRecord, max) == 40);
    assert!(offset_of!(IaxCompletionRecord, sum) == 44);
    assert!(offset_of!(IaxCompletionRecord, rsvd4) == 48);
};

/// Number of literal/length symbols in an AECS Huffman table.
pub const AECS_LL_SYMS: usize = 286;
/// Number of distance symbols in an AECS Huffman table.
pub const AECS_D_SYMS: usize = 30;
/// Size of the compress AECS (`struct aecs_comp_table_record`).
pub const AECS_COMP_SIZE: usize = 1568;
/// `FIXED_HDR`: BTYPE=01 (fixed Huffman) in the deflate block header.
pub const FIXED_HDR: u8 = 0x2;
/// `FIXED_HDR_SIZE`: bits in the block header (BFINAL + BTYPE).
pub const FIXED_HDR_SIZE: u32 = 3;

/// `struct aecs_comp_table_record` (iaa_crypto.h): the Analytics Engine
/// Configuration and State a compress reads through `src2_addr`. In fixed
/// mode it holds RFC 1951's fixed Huffman codes and a pre-loaded block
/// header, so the device emits one final fixed-Huffman block.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
pub struct AecsCompTable {
    /// `crc`: running CRC seed (0).
    pub crc: u32,
    /// `xor_checksum`: running checksum seed (0).
    pub xor_checksum: u32,
    /// `reserved0[5]`.
    pub reserved0: [u32; 5],
    /// `num_output_accum_bits`: bits pre-loaded in `output_accum`.
    pub num_output_accum_bits: u32,
    /// `output_accum[256]`: bits emitted before the first symbol.
    pub output_accum: [u8; 256],
    /// `ll_sym[286]`: per literal/length symbol, `(len << 15) | code`.
    pub ll_sym: [u32; AECS_LL_SYMS],
    /// `reserved1`.
    pub reserved1: u32,
    /// `reserved2`.
    pub reserved2: u32,
    /// `d_sym[30]`: per distance symbol, `(len << 15) | code`.
    pub d_sym: [u32; AECS_D_SYMS],
    /// `reserved_padding[2]`.
    pub reserved_padding: [u32; 2],
}

const _: () = {
    assert!(offset_of!(AecsCompTable, num_output_accum_bits) == 28);
    assert!(offset_of!(AecsCompTable, output_accum) == 32);
    assert!(offset_of!(AecsCompTable, ll_sym) == 288);
    assert!(offset_of!(AecsCompTable, d_sym) == 1440);
    assert!(offset_of!(AecsCompTable, reserved_padding) == 1560);
    // The C struct is packed and 1568 bytes; the Rust one only adds tail
    // padding for its 64-byte alignment, which `src2_size` excludes.
    assert!(size_of::<AecsCompTable>() >= AECS_COMP_SIZE);
};

impl AecsCompTable {
    /// The fixed-Huffman AECS, as iaa_crypto's `init_fixed_mode` builds it:
    /// RFC 1951 §3.2.6 codes and `FIXED_HDR | BFINAL` pre-loaded.
    pub fn fixed() -> Self {
        let mut ll_sym = [0u32; AECS_LL_SYMS];
        for (sym, e) in ll_sym.iter_mut().enumerate() {
            let s = sym as u32;
            // (code length, first code, first symbol) per RFC 1951 range.
            let (len, base, first) = match s {
                0..=143 => (8, 0x30, 0),
                144..=255 => (9, 0x190, 144),
                256..=279 => (7, 0x00, 256),
                _ => (8, 0xc0, 280),
            };
            *e = (len << 15) | (base + s - first);
        }
        let mut d_sym = [0u32; AECS_D_SYMS];
        for (sym, e) in d_sym.iter_mut().enumerate() {
            *e = (5 << 15) | sym as u32;
        }
        let mut output_accum = [0u8; 256];
        output_accum[0] = FIXED_HDR | 1;
        AecsCompTable {
            crc: 0,
            xor_checksum: 0,
            reserved0: [0; 5],
            num_output_accum_bits: FIXED_HDR_SIZE,
            output_accum,
            ll_sym,
            reserved1: 0,
            reserved2: 0,
            d_sym,
            reserved_padding: [0; 2],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_bytes_round_trip_and_match_memory_layout() {
        let mut d = IaxHwDesc::new(IAX_OPCODE_COMPRESS, COMPRESS_DESC_FLAGS);
        d.completion_addr = 0x1122_3344_5566_7740;
        d.src1_addr = 0xa0a0_0000_1000;
        d.dst_addr = 0xb0b0_0000_2000;
        d.src1_size = 4096;
        d.op_flags = IAA_COMP_FLAGS;
        d.src2_addr = 0xc0c0_0000_3000;
        d.max_dst_size = 3072;
        d.src2_size = AECS_COMP_SIZE as u32;
        let b = d.to_bytes();
        assert_eq!(IaxHwDesc::from_bytes(&b), d);
        assert_eq!(
            b[7], IAX_OPCODE_COMPRESS,
            "opcode is the top byte of dword 1"
        );
        assert_eq!(
            u32::from_le_bytes([b[4], b[5], b[6], 0]),
            COMPRESS_DESC_FLAGS
        );
        assert_eq!(d.opcode(), IAX_OPCODE_COMPRESS);
        assert_eq!(d.flags(), 0x01_010c);
        if cfg!(target_endian = "little") {
            // SAFETY: IaxHwDesc is repr(C), 64 bytes, plain integers.
            let raw: [u8; 64] = unsafe { std::mem::transmute(d) };
            assert_eq!(raw, b);
        }
    }

    #[test]
    fn fixed_aecs_matches_iaa_crypto_tables() {
        let a = AecsCompTable::fixed();
        // Spot values from iaa_crypto_comp_fixed.c.
        assert_eq!(a.ll_sym[0], 0x40030);
        assert_eq!(a.ll_sym[143], 0x400BF);
        assert_eq!(a.ll_sym[144], 0x48190);
        assert_eq!(a.ll_sym[256], 0x38000);
        assert_eq!(a.ll_sym[279], 0x38017);
        assert_eq!(a.ll_sym[280], 0x400C0);
        assert_eq!(a.ll_sym[285], 0x400C5);
        assert_eq!(a.d_sym[0], 0x28000);
        assert_eq!(a.d_sym[29], 0x2801D);
        assert_eq!(a.output_accum[0], 0x3);
        assert_eq!(a.num_output_accum_bits, 3);
    }
}
