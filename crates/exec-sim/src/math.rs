//! Scalar maths the standard library lacks (erf), and the float formulas of the unary ops, each computed in
//! f64 and rounded once to f32, so every op has one formula whether fused or not.

use std::f64::consts::{FRAC_2_SQRT_PI, PI, SQRT_2};

/// The Gauss error function in f64, accurate to about 1e-15 absolute.
///
/// |x| < 1.5: the Maclaurin series (terms peak below e^{x^2} ~ 10, so cancellation costs about one digit);
/// 1.5 <= |x| < 6: erfc from its continued fraction, 100 terms (converged to f64 precision from 1.5 on);
/// beyond: +-1 (erfc(6) ~ 2e-17).
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    let a = x.abs();
    let r = if a < 1.5 {
        let x2 = a * a;
        let mut term = a;
        let mut sum = a;
        let mut n = 1.0f64;
        while n < 200.0 {
            term *= -x2 / n;
            let t = term / (2.0 * n + 1.0);
            sum += t;
            if t.abs() < 1e-17 * sum.abs() {
                break;
            }
            n += 1.0;
        }
        FRAC_2_SQRT_PI * sum
    } else if a < 6.0 {
        // erfc(a) = e^{-a^2}/sqrt(pi) * 1/(a + (1/2)/(a + 1/(a + (3/2)/(a + ...)))), evaluated backwards.
        let mut t = a;
        for k in (1..=100).rev() {
            t = a + (k as f64 / 2.0) / t;
        }
        1.0 - (-a * a).exp() / (PI.sqrt() * t)
    } else {
        1.0
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// erf rounded to f32.
pub fn erf_f32(x: f32) -> f32 {
    erf(x as f64) as f32
}

/// Exact Gelu: `0.5 x (1 + erf(x / sqrt 2))`.
pub fn gelu(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * (1.0 + erf(x / SQRT_2))) as f32
}

/// Tanh-approximated Gelu: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu_tanh(x: f32) -> f32 {
    let x = x as f64;
    let k = (2.0 / PI).sqrt();
    (0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())) as f32
}

/// `1 / (1 + e^-x)`.
pub fn sigmoid(x: f32) -> f32 {
    (1.0 / (1.0 + (-(x as f64)).exp())) as f32
}

/// `x * sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    let x = x as f64;
    (x / (1.0 + (-x).exp())) as f32
}

/// `max(0, min(1, alpha x + beta))`.
pub fn hard_sigmoid(x: f32, alpha: f32, beta: f32) -> f32 {
    let v = alpha as f64 * x as f64 + beta as f64;
    if x.is_nan() {
        return f32::NAN;
    }
    v.clamp(0.0, 1.0) as f32
}

/// `x * max(0, min(1, x/6 + 1/2))`.
pub fn hard_swish(x: f32) -> f32 {
    if x.is_nan() {
        return f32::NAN;
    }
    let x = x as f64;
    (x * (x / 6.0 + 0.5).clamp(0.0, 1.0)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_reference_values() {
        // Reference values of erf to 16 digits.
        let cases = [
            (0.0, 0.0),
            (0.1, 0.1124629160182849),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (2.9, 0.9999589021219005),
            (3.0, 0.9999779095030014),
            (3.5, 0.9999992569016276),
            (5.0, 0.9999999999984626),
            (-1.5, -0.9661051464753108),
        ];
        for (x, want) in cases {
            let got = erf(x);
            assert!((got - want).abs() < 1e-14, "erf({x}) = {got}, want {want}");
        }
        assert_eq!(erf(10.0), 1.0);
        assert_eq!(erf(-10.0), -1.0);
        assert!(erf(f64::NAN).is_nan());
    }

    #[test]
    fn activations_at_known_points() {
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-6);
        assert_eq!(sigmoid(0.0), 0.5);
        assert_eq!(hard_swish(3.0), 3.0);
        assert_eq!(hard_swish(-3.0), 0.0);
        assert_eq!(hard_sigmoid(10.0, 0.2, 0.5), 1.0);
        assert_eq!(silu(0.0), 0.0);
    }
}
