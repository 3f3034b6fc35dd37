//! Real model files through the whole stack against gguf-py: cera reads the GGUF, boostr
//! dequantizes (CPU reference and packed GPU layout) and gathers embedding rows on the GPU. The
//! goldens come from gguf-py reading the same files on its own (`scripts/make_model_goldens.py`).
//! Gemma 3's Q8_0 embedding (178 MB) is larger than lavapipe's 128 MiB binding, so on such an
//! adapter the GPU gather runs over a table split across bindings.

use boostr::embedding::GpuEmbedding;
use boostr::formats::{GgmlType, dequantize, repack};
use cera::fetch::{ModelId, ensure_model};
use cera::gguf::GgufFile;
use serde_json::Value;

fn golden(name: &str) -> Value {
    let path = format!("{}/golden/model/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("golden file")).expect("golden json")
}

fn check_model(id: ModelId, golden_file: &str) {
    let path = ensure_model(id).expect("fetch the test model");
    let file = GgufFile::open(&path).expect("open gguf");
    let g = golden(golden_file);
    for t in g["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let info = file.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
        let dims: Vec<u64> = t["dims"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        assert_eq!(info.dims, dims, "{name}: dims");
        let ty = GgmlType::from_name(t["type"].as_str().unwrap()).unwrap();
        assert_eq!(info.ty.id(), ty.id(), "{name}: type");
        let cols = dims[0] as usize;
        let rows: usize = dims[1..].iter().product::<u64>() as usize;
        let bytes = file.tensor_data(name).unwrap();
        let values = dequantize(ty, bytes, rows * cols).unwrap();
        let sum: f64 = values.iter().map(|&v| v as f64).sum();
        let abs: f64 = values.iter().map(|&v| (v as f64).abs()).sum();
        let want_abs = t["abs_sum"].as_f64().unwrap();
        assert!((abs - want_abs).abs() <= 1e-9 * want_abs, "{name}: abs sum {abs} vs {want_abs}");
        assert!((sum - t["sum"].as_f64().unwrap()).abs() <= 1e-9 * want_abs, "{name}: sum");
        let packed = repack(ty, bytes, rows, cols).unwrap();
        for (r, want) in t["rows"].as_object().unwrap() {
            let r: usize = r.parse().unwrap();
            let want: Vec<f32> = want.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            assert_eq!(&values[r * cols..r * cols + want.len()], &want[..], "{name}: row {r} (reference)");
            assert_eq!(&packed.dequantize_row(r).unwrap()[..want.len()], &want[..], "{name}: row {r} (packed)");
        }
    }
}

#[test]
fn smollm2_tensors_match_gguf_py() {
    check_model(ModelId::SmolLM2_135M, "smollm2_tensors.json");
}

#[test]
fn gemma3_tensors_match_gguf_py() {
    check_model(ModelId::Gemma3_270M, "gemma3_tensors.json");
}

/// Embedding rows gathered on the GPU from the real tables equal gguf-py's rows.
#[test]
fn gpu_embedding_of_real_tables() {
    let Some(ctx) = numr::testing::test_gpu() else { return };
    for (id, golden_file) in [(ModelId::SmolLM2_135M, "smollm2_tensors.json"), (ModelId::Gemma3_270M, "gemma3_tensors.json")] {
        let file = GgufFile::open(ensure_model(id).unwrap()).unwrap();
        let g = golden(golden_file);
        let t = g["tensors"].as_array().unwrap().iter().find(|t| t["name"] == "token_embd.weight").unwrap();
        let info = file.tensor("token_embd.weight").unwrap();
        let (cols, rows) = (info.dims[0] as usize, info.dims[1] as usize);
        let ty = GgmlType::from_name(t["type"].as_str().unwrap()).unwrap();
        let packed = repack(ty, file.tensor_data("token_embd.weight").unwrap(), rows, cols).unwrap();
        let table = GpuEmbedding::new(&ctx, &packed, None).unwrap();
        let table_bytes = (rows * cols) as u64 * 34 / 32;
        if table_bytes > ctx.capabilities().limits.max_storage_buffer_binding_size {
            assert!(table.n_chunks() > 1, "a table over one binding must be split");
        }
        let want_rows: Vec<(u32, Vec<f32>)> = t["rows"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(r, v)| (r.parse().unwrap(), v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()))
            .collect();
        let ids: Vec<u32> = want_rows.iter().map(|(r, _)| *r).collect();
        let out = table.embed(&ctx, &ids, 1.0).unwrap().to_vec::<f32>().unwrap();
        for (i, (r, want)) in want_rows.iter().enumerate() {
            assert_eq!(&out[i * cols..i * cols + want.len()], &want[..], "{golden_file}: embedding row {r}");
        }
        assert!(table.embed(&ctx, &[rows as u32], 1.0).is_err(), "an id past the vocabulary is an error");
    }
}
