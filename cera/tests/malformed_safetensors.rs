//! Table-driven tests of malformed safetensors files, shard indexes and configs: each case
//! must give its typed error, without a panic, a hang (a generous watchdog, `watchdog/`) or a large allocation.

mod watchdog;

use cera::safetensors::{MAX_HEADER, SafeDType, SafetensorsError, SafetensorsModel, write_safetensors};

fn st_err(bytes: Vec<u8>) -> SafetensorsError {
    match watchdog::within_limit("parsing a malformed safetensors file", move || SafetensorsModel::from_bytes(bytes, None)) {
        Ok(_) => panic!("malformed safetensors accepted"),
        Err(e) => e,
    }
}

fn st_with_header(json: &str, data: usize) -> Vec<u8> {
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    v.resize(v.len() + data, 0);
    v
}

#[test]
fn safetensors_malformed_table() {
    // A case's bytes, the error variant it must give, and optionally text its message must
    // contain (the tensor's name, where one is at fault).
    macro_rules! st {
        ($name:expr, $bytes:expr, $pat:pat) => {
            st!($name, $bytes, $pat, "")
        };
        ($name:expr, $bytes:expr, $pat:pat, $text:expr) => {{
            let e = st_err($bytes);
            assert!(matches!(e, $pat), "case {}: got {e:?}", $name);
            assert!(e.to_string().contains($text), "case {}: `{e}` lacks `{}`", $name, $text);
        }};
    }
    st!("empty", vec![], SafetensorsError::TooShort { .. });
    st!(
        "header lies (too long)",
        {
            let mut v = st_with_header("{}", 0);
            v[..8].copy_from_slice(&1000u64.to_le_bytes());
            v
        },
        SafetensorsError::HeaderTooLarge { .. }
    );
    st!(
        "header 2^63",
        {
            let mut v = st_with_header("{}", 0);
            v[..8].copy_from_slice(&(1u64 << 63).to_le_bytes());
            v
        },
        SafetensorsError::HeaderTooLarge { .. }
    );
    st!(
        "header lies (too short)",
        {
            let mut v = st_with_header(r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#, 4);
            v[..8].copy_from_slice(&10u64.to_le_bytes());
            v
        },
        SafetensorsError::InvalidHeader(_)
    );
    st!("not json", st_with_header("{nope", 0), SafetensorsError::InvalidHeader(_));
    st!("json array", st_with_header("[1]", 0), SafetensorsError::InvalidHeader(_));
    st!("deep json", st_with_header(&format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000)), 0), SafetensorsError::InvalidHeader(_));
    st!("unknown dtype", st_with_header(r#"{"a":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}}"#, 1), SafetensorsError::UnknownDType { .. });
    st!("offsets past end", st_with_header(r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#, 8), SafetensorsError::OutOfBounds { .. });
    st!("reversed offsets", st_with_header(r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}}"#, 8), SafetensorsError::OutOfBounds { .. });
    st!("dtype/shape mismatch", st_with_header(r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, 8), SafetensorsError::ShapeMismatch { .. });
    st!(
        "shape overflow",
        st_with_header(r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#, 8),
        SafetensorsError::ShapeMismatch { .. }
    );
    st!(
        "overlap",
        st_with_header(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#, 12),
        SafetensorsError::Overlap { .. }
    );
    st!("negative dim", st_with_header(r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#, 4), SafetensorsError::InvalidHeader(_), "`a`");
    st!("bad metadata", st_with_header(r#"{"__metadata__":{"a":1}}"#, 0), SafetensorsError::InvalidHeader(_));
    // Each fault the `safetensors` crate reports, mapped to its own variant naming the tensor.
    let two = |b: &str| format!(r#"{{"a":{{"dtype":"F32","shape":[2],"data_offsets":[0,8]}},"b":{}}}"#, b);
    st!("empty file header", st_with_header("", 0), SafetensorsError::InvalidHeader(_));
    st!("seven bytes", vec![0; 7], SafetensorsError::TooShort { file_len: 7 });
    st!(
        "header over the limit",
        {
            let mut v = st_with_header("{}", 0);
            v[..8].copy_from_slice(&(MAX_HEADER + 1).to_le_bytes());
            v
        },
        SafetensorsError::HeaderTooLarge { limit: MAX_HEADER, .. }
    );
    st!(
        "header not UTF-8",
        {
            let mut v = st_with_header(r#"{"x":1}"#, 0);
            v[10] = 0xff;
            v
        },
        SafetensorsError::InvalidHeader(_),
        "UTF-8"
    );
    st!("leading space", st_with_header(r#" {"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#, 4), SafetensorsError::InvalidHeader(_), "'{'");
    st!(
        "unknown dtype named",
        st_with_header(r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"Q4","shape":[1],"data_offsets":[4,5]}}"#, 5),
        SafetensorsError::UnknownDType { .. },
        "`b` has unknown dtype `Q4`"
    );
    st!("sub-byte dtype", st_with_header(r#"{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}"#, 1), SafetensorsError::UnknownDType { .. }, "`F4`");
    st!("half a byte", st_with_header(r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#, 2), SafetensorsError::InvalidHeader(_), "`a`");
    st!("missing field", st_with_header(r#"{"a":{"dtype":"F32","shape":[1]}}"#, 4), SafetensorsError::InvalidHeader(_), "`a`");
    st!("second overlaps", st_with_header(&two(r#"{"dtype":"F32","shape":[1],"data_offsets":[4,8]}"#), 8), SafetensorsError::Overlap { .. }, "`a` and `b`");
    st!(
        "gap",
        st_with_header(&two(r#"{"dtype":"F32","shape":[1],"data_offsets":[12,16]}"#), 16),
        SafetensorsError::NotContiguous { start: 12, expected: 8, .. },
        "`b`"
    );
    st!(
        "second mismatch",
        st_with_header(&two(r#"{"dtype":"F16","shape":[3],"data_offsets":[8,12]}"#), 12),
        SafetensorsError::ShapeMismatch { expected: 6, actual: 4, .. },
        "`b`"
    );
    st!("second reversed", st_with_header(&two(r#"{"dtype":"F32","shape":[0],"data_offsets":[8,4]}"#), 8), SafetensorsError::OutOfBounds { .. }, "`b`");
    st!(
        "trailing bytes",
        st_with_header(&two(r#"{"dtype":"F32","shape":[1],"data_offsets":[8,12]}"#), 20),
        SafetensorsError::TrailingData { end: 12, data_len: 20 }
    );
    let whole = write_safetensors(&[("a", SafeDType::F32, &[2], &[0; 8]), ("b", SafeDType::F16, &[4], &[0; 8])]);
    st!("truncated", whole[..whole.len() - 3].to_vec(), SafetensorsError::OutOfBounds { start: 8, end: 16, data_len: 13, .. }, "`b`");
    st!("header only", whole[..whole.len() - 16].to_vec(), SafetensorsError::OutOfBounds { .. }, "`b`");
    st!("cut in the header", whole[..20].to_vec(), SafetensorsError::HeaderTooLarge { .. });

    // A valid file with an unsupported dtype: data access names the tensor and dtype.
    let m = SafetensorsModel::from_bytes(write_safetensors(&[("x", SafeDType::F64, &[1], &[0; 8])]), None).unwrap();
    let e = m.tensor_data("x").unwrap_err();
    assert!(matches!(e, SafetensorsError::UnsupportedDType { .. }) && e.to_string().contains("F64"), "{e}");
}

#[test]
fn safetensors_bad_index_and_config() {
    let dir = std::env::temp_dir().join(format!("cera-malformed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, body: &[u8]| std::fs::write(dir.join(name), body).unwrap();
    write("model.safetensors.index.json", br#"{"weight_map":{"a":"../evil.safetensors"}}"#);
    let e = SafetensorsModel::open(&dir).unwrap_err();
    assert!(matches!(e, SafetensorsError::InvalidIndex { .. }), "{e:?}");
    write("model.safetensors.index.json", br#"{"weight_map":{"a":"missing.safetensors"}}"#);
    assert!(matches!(SafetensorsModel::open(&dir).unwrap_err(), SafetensorsError::Io { .. }));
    write("model.safetensors.index.json", br#"{"weight_map":[]}"#);
    assert!(matches!(SafetensorsModel::open(&dir).unwrap_err(), SafetensorsError::InvalidIndex { .. }));
    // Two shards that both hold the same tensor.
    let shard = write_safetensors(&[("model.norm.weight", SafeDType::F32, &[1], &[0; 4])]);
    write("a.safetensors", &shard);
    write("b.safetensors", &write_safetensors(&[("model.norm.weight", SafeDType::F32, &[1], &[0; 4]), ("y", SafeDType::F32, &[1], &[0; 4])]));
    write("model.safetensors.index.json", br#"{"weight_map":{"model.norm.weight":"a.safetensors","x":"b.safetensors"}}"#);
    let e = SafetensorsModel::open(&dir).unwrap_err();
    assert!(matches!(e, SafetensorsError::InvalidIndex { ref reason, .. } if reason.contains("`x`")), "{e:?}");
    write("model.safetensors.index.json", br#"{"weight_map":{"model.norm.weight":"a.safetensors","y":"b.safetensors"}}"#);
    assert!(matches!(SafetensorsModel::open(&dir).unwrap_err(), SafetensorsError::DuplicateTensor { .. }));
    write("model.safetensors.index.json", br#"{"weight_map":{"model.norm.weight":"a.safetensors"}}"#);
    write("config.json", br#"{"model_type":"llama","hidden_size":"big"}"#);
    assert!(matches!(SafetensorsModel::open(&dir).unwrap_err(), SafetensorsError::InvalidConfig(_)));
    write("config.json", br#"{"model_type":"llama","hidden_size":8,"num_hidden_layers":1,"num_attention_heads":2}"#);
    let m = SafetensorsModel::open(&dir).unwrap();
    assert_eq!(m.tensor_data("output_norm.weight").unwrap().len(), 4);
    let _ = std::fs::remove_dir_all(&dir);
}
