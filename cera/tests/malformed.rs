//! Table-driven tests of malformed GGUF files (and GGUF tokenizer metadata): each case must give its typed error,
//! without a panic, a hang (a generous watchdog, `watchdog/`) or a large allocation.

mod watchdog;

use cera::gguf::{GgmlType, GgufBuilder, GgufError, GgufFile, MetadataArray, MetadataValue};
use cera::tokenizer::{Tokenizer, TokenizerError};

/// Writes GGUF headers by hand, including invalid ones.
#[derive(Default, Clone)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn kv_u32(&mut self, k: &str, v: u32) -> &mut Self {
        self.str(k).u32(4).u32(v)
    }
    /// A tensor info: name, dims, type id, offset.
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to 32 and appends `n` data bytes.
    fn data(&mut self, n: usize) -> Vec<u8> {
        let mut v = self.0.clone();
        v.resize(v.len().div_ceil(32) * 32 + n, 0xAB);
        v
    }
}

fn gguf_err(bytes: Vec<u8>) -> GgufError {
    match watchdog::within_limit("parsing a malformed GGUF", move || GgufFile::from_bytes(bytes)) {
        Ok(_) => panic!("malformed file was accepted"),
        Err(e) => e,
    }
}

macro_rules! case {
    ($name:expr, $bytes:expr, $pat:pat) => {{
        let e = gguf_err($bytes);
        assert!(matches!(e, $pat), "case {}: got {e:?}", $name);
        // Every error renders a message.
        assert!(!e.to_string().is_empty());
    }};
}

#[test]
fn gguf_malformed_table() {
    let f32_id = GgmlType::F32.id();
    case!("empty", vec![], GgufError::Truncated { .. });
    case!("bad magic", b"GGML\x03\0\0\0".to_vec(), GgufError::BadMagic { .. });
    case!("version 1", Raw::header(1, 0, 0).0, GgufError::UnsupportedVersion { version: 1, .. });
    case!("version 4", Raw::header(4, 0, 0).0, GgufError::UnsupportedVersion { version: 4, .. });
    case!("big endian", Raw::header(3u32.swap_bytes(), 0, 0).0, GgufError::UnsupportedVersion { .. });
    case!("truncated counts", Raw::header(3, 0, 0).0[..12].to_vec(), GgufError::Truncated { .. });
    case!("2^60 tensors", Raw::header(3, 1 << 60, 0).0, GgufError::ImpossibleCount { .. });
    case!("2^60 keys", Raw::header(3, 0, 1 << 60).0, GgufError::ImpossibleCount { .. });
    case!("u64::MAX keys", Raw::header(3, 0, u64::MAX).0, GgufError::ImpossibleCount { .. });
    {
        let mut r = Raw::header(3, 0, 1);
        r.u64(1 << 60);
        case!("2^60-byte key", r.0, GgufError::ImpossibleCount { .. });
    }
    {
        let mut r = Raw::header(3, 0, 1);
        r.str("k").u32(8).u64(1 << 60);
        case!("2^60-byte string value", r.0, GgufError::ImpossibleCount { .. });
    }
    {
        let mut r = Raw::header(3, 0, 1);
        r.str("k").u32(9).u32(4).u64(1 << 60);
        case!("2^60-element array", r.0, GgufError::ImpossibleCount { .. });
    }
    {
        let mut r = Raw::header(3, 0, 1);
        r.str("k").u32(9).u32(8).u64(1 << 58);
        case!("2^58 strings", r.0, GgufError::ImpossibleCount { .. });
    }
    {
        let mut r = Raw::header(3, 0, 1);
        r.str("k").u32(9);
        for _ in 0..10_000 {
            r.u32(9).u64(1);
        }
        r.u32(4).u64(0);
        case!("nesting bomb", r.0, GgufError::NestingTooDeep { .. });
    }
    {
        let mut r = Raw::header(3, 0, 1);
        r.str("k").u32(13).u32(0);
        case!("unknown value type", r.0, GgufError::UnknownValueType { type_id: 13, .. });
    }
    {
        let mut r = Raw::header(3, 0, 1);
        r.str("k").u32(7).u8(2);
        case!("bool 2", r.0, GgufError::InvalidBool { value: 2, .. });
    }
    {
        let mut r = Raw::header(3, 0, 2);
        r.kv_u32("k", 1).kv_u32("k", 2);
        case!("duplicate key", r.0, GgufError::DuplicateKey { .. });
    }
    for (what, a) in [("zero", 0u32), ("three", 3)] {
        let mut r = Raw::header(3, 0, 1);
        r.kv_u32("general.alignment", a);
        case!(what, r.0, GgufError::InvalidAlignment { .. });
    }
    {
        let mut r = Raw::header(3, 0, 1);
        r.str("general.alignment").u32(8).str("32");
        case!("string alignment", r.0, GgufError::InvalidAlignment { .. });
    }
    // Tensor infos.
    let one = |dims: &[u64], ty: u32, offset: u64, data: usize| {
        let mut r = Raw::header(3, 1, 0);
        r.tensor("t", dims, ty, offset);
        r.data(data)
    };
    case!("truncated tensor data", one(&[8], f32_id, 0, 31), GgufError::TensorOutOfBounds { .. });
    case!("offset past end", one(&[8], f32_id, 4096, 32), GgufError::TensorOutOfBounds { .. });
    case!("offset overflows", one(&[8], f32_id, u64::MAX - 15, 32), GgufError::Misaligned { .. });
    case!("offset overflows aligned", one(&[8], f32_id, u64::MAX - 31, 32), GgufError::TensorOutOfBounds { .. });
    case!("misaligned", one(&[8], f32_id, 4, 64), GgufError::Misaligned { offset: 4, .. });
    case!("unknown ggml type", one(&[8], 1000, 0, 32), GgufError::UnknownType { type_id: 1000, .. });
    case!("removed type Q4_2", one(&[32], 4, 0, 32), GgufError::UnsupportedType { ty: GgmlType::Q4_2, .. });
    case!("product overflow", one(&[1 << 40, 1 << 40], f32_id, 0, 32), GgufError::InvalidShape { .. });
    case!("bytes overflow", one(&[1 << 62, 1], f32_id, 0, 32), GgufError::InvalidShape { .. });
    case!("zero dim", one(&[8, 0], f32_id, 0, 32), GgufError::InvalidShape { .. });
    case!("negative dim", one(&[u64::MAX], f32_id, 0, 32), GgufError::InvalidShape { .. });
    case!("no dims", one(&[], f32_id, 0, 32), GgufError::InvalidShape { .. });
    case!("five dims", one(&[1, 1, 1, 1, 1], f32_id, 0, 32), GgufError::TooManyDims { n_dims: 5, .. });
    {
        let mut r = Raw::header(3, 1, 0);
        r.str("t").u32(u32::MAX);
        case!("2^32 dims", r.data(64), GgufError::TooManyDims { .. });
    }
    case!("block size mismatch", one(&[31], GgmlType::Q4_0.id(), 0, 32), GgufError::InvalidShape { .. });
    {
        let mut r = Raw::header(3, 2, 0);
        r.tensor("a", &[16], f32_id, 0).tensor("b", &[16], f32_id, 32);
        case!("overlap", r.data(96), GgufError::OverlappingTensors { .. });
    }
    {
        let mut r = Raw::header(3, 2, 0);
        r.tensor("a", &[8], f32_id, 0).tensor("a", &[8], f32_id, 32);
        case!("duplicate tensor", r.data(64), GgufError::DuplicateTensor { .. });
    }
    {
        let mut r = Raw::header(3, 1, 0);
        r.tensor("t", &[8], f32_id, 0);
        let full = r.data(32);
        let header_len = r.0.len();
        // Every truncation inside the header is a typed error.
        for cut in 0..header_len {
            let e = gguf_err(full[..cut].to_vec());
            assert!(matches!(e, GgufError::Truncated { .. } | GgufError::BadMagic { .. } | GgufError::ImpossibleCount { .. }), "cut at {cut}: {e:?}");
        }
        GgufFile::from_bytes(full).unwrap();
    }
}

#[test]
fn gguf_unsupported_type_is_named_when_data_is_asked_for() {
    let mut b = GgufBuilder::new(2);
    b.tensor("blk.0.iq", &[256], GgmlType::IQ2_XXS, vec![0; 66]);
    b.tensor("blk.0.mx", &[32], GgmlType::MXFP4, vec![0; 17]);
    // A type ggml removed after GGUF files held it, and one newer than the other two.
    b.tensor("blk.0.q44", &[64], GgmlType::Q4_0_4_4, vec![0; 36]);
    b.tensor("blk.0.nv", &[64], GgmlType::NVFP4, vec![0; 36]);
    let f = GgufFile::from_bytes(b.build()).unwrap();
    let types = [("blk.0.iq", GgmlType::IQ2_XXS), ("blk.0.mx", GgmlType::MXFP4), ("blk.0.q44", GgmlType::Q4_0_4_4), ("blk.0.nv", GgmlType::NVFP4)];
    for (name, ty) in types {
        assert_eq!(f.tensor(name).unwrap().ty, ty);
        assert_eq!(f.tensor_data_raw(name).unwrap().len() as u64, f.tensor(name).unwrap().n_bytes);
        let e = f.tensor_data(name).unwrap_err();
        assert!(matches!(&e, GgufError::UnsupportedType { name: n, ty: t } if n == name && *t == ty), "{e:?}");
        assert!(e.to_string().contains(name) && e.to_string().contains(ty.name()));
    }
}

#[test]
fn gguf_bad_tokenizer_metadata() {
    let build = |f: &dyn Fn(&mut GgufBuilder)| {
        let mut b = GgufBuilder::new(3);
        f(&mut b);
        GgufFile::from_bytes(b.build()).unwrap()
    };
    let toks = |v: &[&str]| MetadataValue::Array(MetadataArray::String(v.iter().map(|s| s.to_string()).collect()));
    let cases: Vec<(&str, GgufFile)> = vec![
        (
            "no model",
            build(&|b| {
                b.kv("tokenizer.ggml.tokens", toks(&["a"]));
            }),
        ),
        (
            "unknown model",
            build(&|b| {
                b.kv("tokenizer.ggml.model", MetadataValue::String("t5".into()));
                b.kv("tokenizer.ggml.tokens", toks(&["a"]));
            }),
        ),
        (
            "empty vocab",
            build(&|b| {
                b.kv("tokenizer.ggml.model", MetadataValue::String("llama".into()));
                b.kv("tokenizer.ggml.tokens", toks(&[]));
            }),
        ),
        (
            "score count",
            build(&|b| {
                b.kv("tokenizer.ggml.model", MetadataValue::String("llama".into()));
                b.kv("tokenizer.ggml.tokens", toks(&["a", "b"]));
                b.kv("tokenizer.ggml.scores", MetadataValue::Array(MetadataArray::F32(vec![0.0])));
            }),
        ),
        (
            "tokens not strings",
            build(&|b| {
                b.kv("tokenizer.ggml.model", MetadataValue::String("llama".into()));
                b.kv("tokenizer.ggml.tokens", MetadataValue::Array(MetadataArray::U8(vec![1])));
            }),
        ),
        (
            "merge without space",
            build(&|b| {
                b.kv("tokenizer.ggml.model", MetadataValue::String("gpt2".into()));
                b.kv("tokenizer.ggml.tokens", toks(&["a", "b"]));
                b.kv("tokenizer.ggml.merges", toks(&["ab"]));
            }),
        ),
        (
            "unknown pre-tokenizer",
            build(&|b| {
                b.kv("tokenizer.ggml.model", MetadataValue::String("gpt2".into()));
                b.kv("tokenizer.ggml.pre", MetadataValue::String("klingon".into()));
                b.kv("tokenizer.ggml.tokens", toks(&["a"]));
                b.kv("tokenizer.ggml.merges", toks(&[]));
            }),
        ),
    ];
    for (what, f) in cases {
        let e = Tokenizer::from_gguf(&f).unwrap_err();
        assert!(
            matches!(
                e,
                TokenizerError::Metadata(_)
                    | TokenizerError::UnsupportedModel(_)
                    | TokenizerError::InvalidVocab(_)
                    | TokenizerError::UnsupportedPreTokenizer(_)
            ),
            "{what}: {e:?}"
        );
    }
    // A token id outside the vocabulary is a typed error, not a panic.
    let f = build(&|b| {
        b.kv("tokenizer.ggml.model", MetadataValue::String("llama".into()));
        b.kv("tokenizer.ggml.tokens", toks(&["a", "b"]));
        b.kv("tokenizer.ggml.bos_token_id", MetadataValue::U32(99));
    });
    let t = Tokenizer::from_gguf(&f).unwrap();
    assert_eq!(t.special().bos, Some(1), "an out-of-range bos falls back to the default, as in llama.cpp");
    assert!(matches!(t.decode(&[5], Default::default()), Err(TokenizerError::InvalidTokenId { id: 5, .. })));
}
