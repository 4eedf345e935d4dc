//! The inverse of `arbitrary`: the raw fuzzer bytes that
//! `FuzzDelivery::arbitrary_take_rest` (and `AnyDelivery`'s) decode back into
//! a given delivery. The seed generator ([`crate::seeds`]) writes deliveries
//! it builds on purpose (valid signed ones, near misses) as files the fuzzers
//! start from and the test suite replays.
//!
//! Hand-written because `arbitrary` only decodes. It follows the format of
//! `arbitrary` 1.5 (the version both `Cargo.lock`s hold): integers are
//! little-endian, a bool is one byte (`& 1`), an `Option` a bool and then the
//! value, a `Vec` is a "one more" bool before each element and a false one at
//! the end, an enum variant a `u32` scaled by the number of variants, and a
//! `String` (only the public-URL query here) is its bytes, with its length
//! taken from the *end* of the input. [`delivery_bytes`] decodes what it
//! encoded and panics on any difference, so a change of format is caught the
//! first time the seeds are checked, never written silently.

use arbitrary::{Arbitrary, Unstructured};

use super::harness::{AnyDelivery, FuzzDelivery, FuzzName, Scheme};

/// The bytes that decode (take-rest) to `delivery`. Header names must be
/// [`FuzzName::Known`].
pub fn delivery_bytes(delivery: &FuzzDelivery) -> Vec<u8> {
    let mut out = Writer::default();
    out.delivery(delivery);
    let bytes = out.finish();
    let decoded = FuzzDelivery::arbitrary_take_rest(Unstructured::new(&bytes))
        .expect("an encoded delivery decodes");
    assert_eq!(
        format!("{decoded:?}"),
        format!("{delivery:?}"),
        "the encoder no longer matches arbitrary's format"
    );
    bytes
}

/// The bytes that decode (take-rest) to `any` (the `dedup_key` target).
pub fn any_delivery_bytes(any: &AnyDelivery) -> Vec<u8> {
    let mut out = Writer::default();
    out.variant(scheme_index(any.scheme), SCHEMES.len());
    out.delivery(&any.delivery);
    let bytes = out.finish();
    let decoded = AnyDelivery::arbitrary_take_rest(Unstructured::new(&bytes))
        .expect("an encoded delivery decodes");
    assert_eq!(
        format!("{decoded:?}"),
        format!("{any:?}"),
        "the encoder no longer matches arbitrary's format"
    );
    bytes
}

/// The schemes in declaration order (the order `arbitrary` numbers them).
const SCHEMES: [Scheme; 7] = [
    Scheme::Stripe,
    Scheme::GitHub,
    Scheme::Shopify,
    Scheme::StandardWebhooks,
    Scheme::Slack,
    Scheme::Twilio,
    Scheme::GenericHmac,
];

fn scheme_index(scheme: Scheme) -> usize {
    SCHEMES
        .iter()
        .position(|s| *s == scheme)
        .expect("every scheme is listed")
}

/// Bytes read from the front, in order, and (for string lengths) bytes read
/// from the back.
#[derive(Default)]
struct Writer {
    front: Vec<u8>,
    /// A string length still to place: (bytes of the front read before the
    /// length is taken, the length).
    tail_length: Option<(usize, usize)>,
}

impl Writer {
    fn delivery(&mut self, delivery: &FuzzDelivery) {
        for header in &delivery.headers {
            self.more(true);
            match &header.name {
                FuzzName::Known(index) => {
                    self.variant(0, 2);
                    self.front.push(*index);
                }
                FuzzName::Other(_) => panic!("the encoder writes known header names only"),
            }
            self.byte_vec(&header.value);
        }
        self.more(false);
        self.byte_vec(&delivery.body);
        match &delivery.query {
            Some(query) => {
                self.more(true);
                self.string(query);
            }
            None => self.more(false),
        }
        self.front
            .extend_from_slice(&delivery.clock_skew.to_le_bytes());
        match &delivery.sign {
            Some(signing) => {
                self.more(true);
                self.more(signing.previous_secret);
                self.front
                    .extend_from_slice(&signing.timestamp_offset.to_le_bytes());
            }
            None => self.more(false),
        }
        self.front.push(delivery.variant);
    }

    /// A bool (also the "one more element" marker of a `Vec`).
    fn more(&mut self, value: bool) {
        self.front.push(u8::from(value));
    }

    /// Variant `index` of an enum of `count` variants: the smallest `u32`
    /// that `(x * count) >> 32` maps to `index`.
    fn variant(&mut self, index: usize, count: usize) {
        let (index, count) = (index as u64, count as u64);
        let x = (index << 32).div_ceil(count);
        let x = u32::try_from(x).expect("a variant index below the count");
        self.front.extend_from_slice(&x.to_le_bytes());
    }

    fn byte_vec(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.more(true);
            self.front.push(*byte);
        }
        self.more(false);
    }

    fn string(&mut self, text: &str) {
        assert!(
            self.tail_length.is_none(),
            "the encoder places one string length only"
        );
        self.tail_length = Some((self.front.len(), text.len()));
        self.front.extend_from_slice(text.as_bytes());
    }

    /// The input: the front bytes, then the string length (if any) where
    /// `arbitrary_len` takes it from: the end, in as many bytes as the data
    /// left at that point needs (one byte up to 256 bytes left, else two).
    fn finish(self) -> Vec<u8> {
        let mut bytes = self.front;
        if let Some((read_before, length)) = self.tail_length {
            let left_in_front = bytes.len() - read_before;
            if left_in_front < 256 {
                bytes.push(u8::try_from(length).expect("a short string"));
            } else {
                let length = u16::try_from(length).expect("a string under 64 KiB");
                bytes.extend_from_slice(&length.to_be_bytes());
            }
        }
        bytes
    }
}
