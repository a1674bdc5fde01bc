//! Host-side tensor reshaping for plan sets: padding a request into a bucket (zeros after the valid part of
//! each axis), slicing a bucket's output back, and cutting or joining along one axis for chunked requests. All
//! row-major, on raw element bytes.

/// The byte sizes of a box `small` inside `big` (same rank, each extent at most `big`'s), after checking that
/// `data_len` is the size of the one the data has (`big` when `data_is_big`); `None` when anything does not fit.
fn box_bytes(data_len: usize, small: &[usize], big: &[usize], elem: usize, data_is_big: bool) -> Option<usize> {
    if small.len() != big.len() || small.iter().zip(big).any(|(s, b)| s > b) {
        return None;
    }
    let n_small = small.iter().try_fold(elem, |a, &d| a.checked_mul(d))?;
    let n_big = big.iter().try_fold(elem, |a, &d| a.checked_mul(d))?;
    let (n_data, n_out) = if data_is_big { (n_big, n_small) } else { (n_small, n_big) };
    (data_len == n_data).then_some(n_out)
}

/// The leading box `to` (each extent at most `from`'s) of a row-major tensor of shape `from` with elements of
/// `elem` bytes; `None` when the shapes or the data do not fit together.
pub fn box_slice(data: &[u8], from: &[usize], to: &[usize], elem: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(box_bytes(data.len(), to, from, elem, true)?);
    copy_box(to, from, elem, |src, len| out.extend_from_slice(&data[src..src + len]));
    Some(out)
}

/// A row-major tensor of shape `to` holding `data` (of shape `from`, each extent at most `to`'s) in its leading
/// box and zeros elsewhere; `None` when the shapes or the data do not fit together.
pub fn box_pad(data: &[u8], from: &[usize], to: &[usize], elem: usize) -> Option<Vec<u8>> {
    let mut out = vec![0u8; box_bytes(data.len(), from, to, elem, false)?];
    let mut src = 0usize;
    copy_box(from, to, elem, |dst, len| {
        out[dst..dst + len].copy_from_slice(&data[src..src + len]);
        src += len;
    });
    Some(out)
}

/// Visit the rows of box `small` inside the row-major `big` shape: `f(byte offset in big, row bytes)`, in order.
fn copy_box(small: &[usize], big: &[usize], elem: usize, mut f: impl FnMut(usize, usize)) {
    if small.contains(&0) {
        return;
    }
    let Some((&last, outer)) = small.split_last() else {
        f(0, elem);
        return;
    };
    // Byte strides of `big`.
    let mut strides = vec![elem; big.len()];
    for i in (0..big.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * big[i + 1];
    }
    let mut idx = vec![0usize; outer.len()];
    loop {
        let off: usize = idx.iter().zip(&strides).map(|(i, s)| i * s).sum();
        f(off, last * elem);
        // Advance the outer multi-index, last axis fastest.
        let mut k = outer.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < outer[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

/// Rows `[start, start + len)` of axis `axis` of a row-major tensor of shape `shape`.
pub fn axis_range(data: &[u8], shape: &[usize], axis: usize, start: usize, len: usize, elem: usize) -> Option<Vec<u8>> {
    let d = *shape.get(axis)?;
    if start.checked_add(len)? > d {
        return None;
    }
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product::<usize>().checked_mul(elem)?;
    if data.len() != outer.checked_mul(d)?.checked_mul(inner)? {
        return None;
    }
    let mut out = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        let base = (o * d + start) * inner;
        out.extend_from_slice(&data[base..base + len * inner]);
    }
    Some(out)
}

/// Join row-major tensors along `axis`: `parts` are (data, shape) pairs equal in every other axis.
pub fn axis_concat(parts: &[(&[u8], &[usize])], axis: usize, elem: usize) -> Option<(Vec<u8>, Vec<usize>)> {
    let (_, first) = parts.first()?;
    let mut shape = first.to_vec();
    *shape.get_mut(axis)? = 0;
    for (_, s) in parts {
        if s.len() != first.len() || (0..s.len()).any(|i| i != axis && s[i] != first[i]) {
            return None;
        }
        shape[axis] += s[axis];
    }
    let outer: usize = first[..axis].iter().product();
    let inner: usize = first[axis + 1..].iter().product::<usize>() * elem;
    let mut out = Vec::with_capacity(outer * shape[axis] * inner);
    for o in 0..outer {
        for (data, s) in parts {
            let row = s[axis] * inner;
            out.extend_from_slice(data.get(o * row..(o + 1) * row)?);
        }
    }
    Some((out, shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pad_then_slice_round_trips_and_zero_fills() {
        // 2x3 of u8 into 3x4.
        let d = [1u8, 2, 3, 4, 5, 6];
        let p = box_pad(&d, &[2, 3], &[3, 4], 1).unwrap();
        assert_eq!(p, vec![1, 2, 3, 0, 4, 5, 6, 0, 0, 0, 0, 0]);
        assert_eq!(box_slice(&p, &[3, 4], &[2, 3], 1).unwrap(), d);
        assert!(box_pad(&d, &[2, 3], &[1, 4], 1).is_none());
        assert!(box_slice(&d[..5], &[2, 3], &[1, 1], 1).is_none());
        assert_eq!(box_slice(&[7, 8], &[], &[], 2).unwrap(), vec![7, 8]);
        // The data must have the size of the shape it comes in: the small one for a pad, the big one for a slice.
        assert!(box_pad(&p, &[2, 3], &[3, 4], 1).is_none());
        assert!(box_slice(&d, &[3, 4], &[2, 3], 1).is_none());
        assert!(box_pad(&d, &[2, 3], &[2, 3, 1], 1).is_none());
        assert_eq!(box_pad(&[1, 2], &[1, 1], &[2, 1], 2).unwrap(), vec![1, 2, 0, 0]);
    }

    #[test]
    fn axis_range_and_concat_invert_each_other() {
        // 2x3x2 of u8, cut axis 1 into [0,2) and [2,3).
        let d: Vec<u8> = (0..12).collect();
        let a = axis_range(&d, &[2, 3, 2], 1, 0, 2, 1).unwrap();
        let b = axis_range(&d, &[2, 3, 2], 1, 2, 1, 1).unwrap();
        assert_eq!(a, vec![0, 1, 2, 3, 6, 7, 8, 9]);
        assert_eq!(b, vec![4, 5, 10, 11]);
        let (j, s) = axis_concat(&[(&a, &[2, 2, 2]), (&b, &[2, 1, 2])], 1, 1).unwrap();
        assert_eq!((j, s), (d, vec![2, 3, 2]));
        assert!(axis_range(&[0; 12], &[2, 3, 2], 1, 2, 2, 1).is_none());
    }
}
