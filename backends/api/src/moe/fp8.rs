//! FP8 (e4m3fn) with one scale per token, as MoE dispatch sends activations: the token's
//! largest magnitude maps to 448, e4m3fn's largest finite value. Conversions round to nearest
//! even and saturate at ±448, as PyTorch's cast to `float8_e4m3fn` does, so a reference built
//! with torch matches bit for bit.

/// e4m3fn's largest finite value.
pub const E4M3_MAX: f32 = 448.0;

/// `x` in e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, no infinities,
/// NaN = `0x7f` (with the sign).
pub fn f32_to_e4m3(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a.is_nan() {
        return sign | 0x7f;
    }
    // Past the largest finite value: saturate (rounding would reach the NaN code).
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    // Below the smallest normal (2^-6) the spacing is 2^-9: round |x| / 2^-9 to an integer
    // (8 lands on the smallest normal's encoding, as it should).
    if a < 1.0 / 64.0 {
        let m = round_half_even(a * 512.0) as u8;
        return sign | m;
    }
    let bits = a.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 7;
    let mant = bits & 0x7f_ffff;
    // Keep 3 of 23 mantissa bits, rounding the 20 dropped ones to nearest even.
    let keep = mant >> 20;
    let rest = mant & 0xf_ffff;
    let half = 0x8_0000;
    let up = rest > half || (rest == half && keep & 1 == 1);
    let code = ((exp as u32) << 3 | keep) + u32::from(up);
    sign | code as u8
}

/// The value of e4m3fn code `b`.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = (b >> 3) & 0xf;
    let mant = f32::from(b & 0x7);
    if exp == 0xf && b & 0x7 == 0x7 {
        return f32::NAN;
    }
    if exp == 0 {
        return sign * mant / 512.0;
    }
    sign * (1.0 + mant / 8.0) * 2f32.powi(i32::from(exp) - 7)
}

fn round_half_even(v: f32) -> f32 {
    let r = v.round();
    if (v - v.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - v.signum()
    } else {
        r
    }
}

/// The scale of one token: its largest magnitude over 448, or 1 for a token of zeros.
pub fn token_scale(row: impl Iterator<Item = f32>) -> f32 {
    let amax = row.fold(0.0f32, |m, v| m.max(v.abs()));
    if amax > 0.0 {
        amax / E4M3_MAX
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for b in 0..=255u8 {
            let v = e4m3_to_f32(b);
            if v.is_nan() {
                assert_eq!(b & 0x7f, 0x7f);
                continue;
            }
            // Negative zero keeps its sign bit.
            assert_eq!(f32_to_e4m3(v), b, "code {b:#x} = {v}");
        }
    }

    #[test]
    fn rounding_and_range() {
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(f32_to_e4m3(448.0), 0x7e);
        assert_eq!(f32_to_e4m3(460.0), 0x7e);
        assert_eq!(f32_to_e4m3(479.9), 0x7e);
        assert_eq!(f32_to_e4m3(480.0), 0x7e);
        assert_eq!(f32_to_e4m3(-1e9), 0xfe);
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7f);
        // 1.0625 sits halfway between 1.0 (even) and 1.125: to even.
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.0625)), 1.0);
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.1875)), 1.25);
        // Subnormals: 2^-9 is the smallest; half of it rounds to even zero.
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.0 / 512.0)), 1.0 / 512.0);
        assert_eq!(f32_to_e4m3(1.0 / 1024.0), 0);
        assert_eq!(f32_to_e4m3(3.0 / 1024.0), 2);
        assert_eq!(token_scale([0.0, -0.0].into_iter()), 1.0);
        assert_eq!(token_scale([1.0, -896.0].into_iter()), 2.0);
    }
}
