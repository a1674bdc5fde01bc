//! Small statistics for the report: medians of repeated timings and the power-law fit of time against size.

/// The median of `xs` (the mean of the two middle values for an even count); `None` when empty or when a
/// value is NaN.
pub fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() || xs.iter().any(|x| x.is_nan()) {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 })
}

/// A least-squares fit of `y = coefficient * x^exponent` on log-log axes.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct PowerFit {
    /// The slope on log-log axes: 1 is linear, 2 quadratic.
    pub exponent: f64,
    /// `y` at `x = 1`.
    pub coefficient: f64,
    /// Coefficient of determination of the log-log line (1 is a perfect fit).
    pub r2: f64,
    /// Points the fit used.
    pub points: usize,
}

impl PowerFit {
    /// The fitted `y` at `x`.
    pub fn at(&self, x: f64) -> f64 {
        self.coefficient * x.powf(self.exponent)
    }
}

/// Fit `y = c x^k` by least squares on `(ln x, ln y)`. Points with a non-positive or non-finite coordinate
/// are skipped (a logarithm cannot place them); `None` when fewer than two distinct `x` remain.
pub fn fit_power_law(points: &[(f64, f64)]) -> Option<PowerFit> {
    let logs: Vec<(f64, f64)> = points
        .iter()
        .filter(|(x, y)| x.is_finite() && y.is_finite() && *x > 0.0 && *y > 0.0)
        .map(|&(x, y)| (x.ln(), y.ln()))
        .collect();
    let n = logs.len() as f64;
    if logs.len() < 2 {
        return None;
    }
    let mx = logs.iter().map(|p| p.0).sum::<f64>() / n;
    let my = logs.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = logs.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = logs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let syy: f64 = logs.iter().map(|p| (p.1 - my).powi(2)).sum();
    if sxx <= f64::EPSILON {
        return None;
    }
    let k = sxy / sxx;
    let r2 = if syy <= f64::EPSILON { 1.0 } else { (sxy * sxy) / (sxx * syy) };
    Some(PowerFit { exponent: k, coefficient: (my - k * mx).exp(), r2, points: logs.len() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn median_of_odd_even_and_degenerate_lists() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn exact_power_laws_are_recovered() {
        let lin: Vec<(f64, f64)> = [1e3, 1e4, 1e5].iter().map(|&x| (x, 2e-3 * x)).collect();
        let f = fit_power_law(&lin).unwrap();
        assert!((f.exponent - 1.0).abs() < 1e-12, "{f:?}");
        assert!((f.coefficient - 2e-3).abs() < 1e-12);
        assert!((f.r2 - 1.0).abs() < 1e-12);
        assert!((f.at(1e6) - 2e3).abs() < 1e-6);
        let quad: Vec<(f64, f64)> = [10.0, 20.0, 40.0, 80.0].iter().map(|&x| (x, 0.5 * x * x)).collect();
        assert!((fit_power_law(&quad).unwrap().exponent - 2.0).abs() < 1e-12);
    }

    #[test]
    fn n_log_n_fits_a_little_above_one() {
        let pts: Vec<(f64, f64)> = [1e3, 1e4, 1e5, 1e6].iter().map(|&x: &f64| (x, x * x.ln())).collect();
        let k = fit_power_law(&pts).unwrap().exponent;
        assert!(k > 1.05 && k < 1.15, "{k}");
    }

    #[test]
    fn unusable_points_are_skipped_and_too_few_give_none() {
        assert_eq!(fit_power_law(&[]), None);
        assert_eq!(fit_power_law(&[(10.0, 1.0)]), None);
        assert_eq!(fit_power_law(&[(10.0, 1.0), (10.0, 2.0)]), None);
        let f = fit_power_law(&[(0.0, 1.0), (10.0, 0.0), (10.0, 10.0), (100.0, 100.0), (f64::NAN, 1.0)]).unwrap();
        assert_eq!(f.points, 2);
        assert!((f.exponent - 1.0).abs() < 1e-12);
    }

    proptest! {
        #[test]
        fn fit_recovers_any_exponent_and_scale(k in -3.0f64..3.0, c in 1e-6f64..1e6, x0 in 1.0f64..1e3) {
            let pts: Vec<(f64, f64)> = (0..5).map(|i| {
                let x = x0 * 3f64.powi(i);
                (x, c * x.powf(k))
            }).collect();
            let f = fit_power_law(&pts).unwrap();
            prop_assert!((f.exponent - k).abs() < 1e-9);
            prop_assert!((f.coefficient / c - 1.0).abs() < 1e-6);
        }

        #[test]
        fn median_lies_between_min_and_max(xs in proptest::collection::vec(-1e9f64..1e9, 1..50)) {
            let m = median(&xs).unwrap();
            let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            prop_assert!(lo <= m && m <= hi);
            let below = xs.iter().filter(|&&x| x < m).count();
            prop_assert!(below <= xs.len() / 2);
        }
    }
}
