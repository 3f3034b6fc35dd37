//! WGSL snippets shared by numr's kernel families: typed loads from `array<u32>` bindings for every
//! dtype, and packing of one output word. Every tensor binding is an `array<u32>`, so the same
//! kernel handles f16/bf16/u8 without the 16-bit storage feature, and each invocation writes whole
//! words (sub-word outputs never race).

use crate::dtype::DType;

/// The type a kernel computes in for values of `dtype`.
pub fn compute_ty(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => "f32",
        DType::I32 => "i32",
        DType::U32 | DType::U8 => "u32",
    }
}

/// `fn ld_<name>(i: u32) -> <compute_ty>`: element `i` of binding `name` holding `dtype`.
pub fn load_fn(name: &str, dtype: DType) -> String {
    let body = match dtype {
        DType::F32 => format!("return bitcast<f32>({name}[i]);"),
        DType::I32 => format!("return bitcast<i32>({name}[i]);"),
        DType::U32 => format!("return {name}[i];"),
        // A select, not a dynamic vector index: NVIDIA spills dynamically indexed vectors to local
        // memory (measured: a 5x slower f16 matmul on the H200).
        DType::F16 => format!("let v = unpack2x16float({name}[i >> 1u]);\n    return select(v.x, v.y, (i & 1u) == 1u);"),
        DType::BF16 => format!("let w = {name}[i >> 1u];\n    return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (i & 1u) == 1u));"),
        DType::U8 => format!("return ({name}[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;"),
    };
    format!("fn ld_{name}(i: u32) -> {} {{\n    {body}\n}}\n", compute_ty(dtype))
}

/// `fn cv_<from>_<to>(v) -> compute_ty(to)`: value conversion with saturation (as Rust's `as`).
pub fn convert_fn(from: DType, to: DType) -> String {
    let (f, t) = (compute_ty(from), compute_ty(to));
    let expr = match (f, t, to) {
        (_, _, DType::U8) if f == "f32" => "u32(clamp(v, 0.0, 255.0))".to_string(),
        (_, _, DType::U8) if f == "i32" => "u32(clamp(v, 0, 255))".to_string(),
        (_, _, DType::U8) => "min(v, 255u)".to_string(),
        (a, b, _) if a == b => "v".to_string(),
        ("i32", "f32", _) | ("u32", "f32", _) => "f32(v)".to_string(),
        ("f32", "i32", _) => "i32(v)".to_string(),
        ("f32", "u32", _) => "u32(v)".to_string(),
        ("i32", "u32", _) => "u32(max(v, 0))".to_string(),
        ("u32", "i32", _) => "i32(min(v, 2147483647u))".to_string(),
        _ => unreachable!("all compute-type pairs are covered"),
    };
    format!("fn cv_{}_{}(v: {f}) -> {t} {{\n    return {expr};\n}}\n", from.name(), to.name())
}

/// `fn bits_<dtype>(v: compute_ty) -> u32`: the element's bits in the low bits of a u32.
pub fn bits_fn(dtype: DType) -> String {
    let (ty, expr) = match dtype {
        DType::F32 => ("f32", "bitcast<u32>(v)"),
        DType::I32 => ("i32", "bitcast<u32>(v)"),
        DType::U32 => ("u32", "v"),
        DType::U8 => ("u32", "v & 0xffu"),
        // f16 through pack2x16float keeps only the low half.
        DType::F16 => ("f32", "pack2x16float(vec2<f32>(v, 0.0)) & 0xffffu"),
        // bf16: round to nearest even on the upper 16 bits (NaN stays NaN).
        DType::BF16 => ("f32", "select((bitcast<u32>(v) + 0x7fffu + ((bitcast<u32>(v) >> 16u) & 1u)) >> 16u, (bitcast<u32>(v) >> 16u) | 0x40u, v != v)"),
    };
    format!("fn bits_{}(v: {ty}) -> u32 {{\n    return {expr};\n}}\n", dtype.name())
}

/// WGSL that fills `word` (a `var` u32) from `per_word` values computed by the expression
/// `value(e)` for element indices `e = w * per_word + j`, skipping elements at or past `count`.
/// `value` must be a WGSL expression using the variable `e`.
pub fn pack_word(dtype: DType, value: &str, w: &str, count: &str) -> String {
    let per = dtype.per_word();
    let bits = 32 / per;
    let mut s = String::from("var word = 0u;\n");
    for j in 0..per {
        s.push_str(&format!("    {{ let e = {w} * {per}u + {j}u; if (e < {count}) {{ word |= bits_{}({value}) << {}u; }} }}\n", dtype.name(), j * bits));
    }
    s
}
