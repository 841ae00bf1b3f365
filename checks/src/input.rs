//! Reading structured values out of fuzzer bytes.

/// A cursor over fuzzer input. Reads past the end give zeros, so every byte string decodes to
/// something and a truncated input is a prefix of a longer one (which helps the fuzzer's
/// mutations).
#[derive(Debug, Clone)]
pub struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    /// A cursor at the start of `data`.
    #[must_use]
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    /// Whether every byte was read.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next byte, or 0 past the end.
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// The next two bytes, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// The next four bytes, little-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_zeros_past_the_end() {
        let mut b = Bytes::new(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(b.u8(), 1);
        assert_eq!(b.u16(), 0x0302);
        assert!(!b.is_empty());
        assert_eq!(b.u32(), 0x0006_0504);
        assert!(b.is_empty());
        assert_eq!((b.u8(), b.u16(), b.u32()), (0, 0, 0));
    }
}
