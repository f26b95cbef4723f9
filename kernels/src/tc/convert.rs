//! Number formats of the tensor-core GEMMs: TF32 (an `f32` with 10 mantissa bits, held in an `f32` word) and
//! BF16 (the top 16 bits of an `f32`, stored as `u16`).
//!
//! On the GPU each conversion is one `cvt` instruction; on the host the same rounding is done on the bits.
//! Both round to nearest: TF32 ties away from zero (`cvt.rna.tf32.f32`), BF16 ties to even
//! (`cvt.rn.bf16.f32`). NaN stays NaN.

/// `x` rounded to TF32 (`cvt.rna.tf32.f32`): 10 mantissa bits, to nearest, ties away from zero. The result
/// is an `f32` bit pattern with the low 13 bits zero.
#[inline(always)]
pub fn to_tf32(x: f32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: u32;
        // SAFETY: a register-only conversion.
        unsafe {
            core::arch::asm!("cvt.rna.tf32.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
                options(pure, nomem, nostack))
        };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let bits = x.to_bits();
        if x.is_nan() {
            return bits | 0x0040_0000;
        }
        // Adding half an ulp of the kept part to the magnitude rounds ties away; an overflow lands on
        // infinity, as the hardware does.
        bits.wrapping_add(0x1000) & 0xffff_e000
    }
}

/// `x` rounded to BF16 (`cvt.rn.bf16.f32`): to nearest, ties to even; NaN stays a (quiet) NaN.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: u16;
        // SAFETY: a register-only conversion.
        unsafe {
            core::arch::asm!("cvt.rn.bf16.f32 {r}, {x};", r = out(reg16) r, x = in(reg32) x,
                options(pure, nomem, nostack))
        };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let bits = x.to_bits();
        if x.is_nan() {
            return ((bits >> 16) as u16) | 0x0040;
        }
        let round = 0x7fff + ((bits >> 16) & 1);
        (bits.wrapping_add(round) >> 16) as u16
    }
}

/// The `f32` value of BF16 bits (exact).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Two BF16 values in one word, `lo` in the low half (the order of `mma` and `ldmatrix` fragments).
#[inline(always)]
pub fn pack_bf16(lo: u16, hi: u16) -> u32 {
    u32::from(lo) | (u32::from(hi) << 16)
}
