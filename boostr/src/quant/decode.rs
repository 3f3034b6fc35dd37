//! Shared WGSL block decoders: one function per format, used by the GEMV, the GEMM and the
//! fused kernels alike.
//!
//! Every kernel walks a weight row in **chunks of 32 elements** (one legacy block, one K-quant
//! sub-block, one AWQ/GPTQ run, or 32 float elements). Chunk `c` is counted from the start of
//! the [`super::QuantPart`] (`c = local_row * chunks_per_row + kc`), and the decoders read the
//! part's single buffer through two views of it: `wv: array<vec4<u32>>` (wide quant loads) and
//! `ws: array<u32>` (scales, bit planes, f16 `d`/`m` pairs). Section offsets arrive as the
//! parameters `p.qs4`, `p.qh4` (in vec4 units), `p.qh`, `p.sc`, `p.dof`, `p.mof` (in words)
//! and `p.cpg` (chunks per AWQ/GPTQ group).
//!
//! Quantized formats decode to a WGSL `QChunk`: eight words `w[i]` holding elements
//! `4i .. 4i+3` as signed bytes (small non-negative integers for every format but Q8_0) and an
//! affine map per half chunk: element `e` is `a[e / 16] * q + b[e / 16]`. The offset `b` does not
//! depend on the element, so a GEMV multiplies by `a` once per half chunk and adds
//! `b * sum(x)`, a term it shares across every weight row (the sum of activations is computed
//! once per chunk). The same bytes feed `dot4I8Packed` directly.
//!
//! | format | chunk | `q` bytes | `a` | `b` |
//! |---|---|---|---|---|
//! | Q4_0 | block | nibbles | d | -8 d |
//! | Q4_1 | block | nibbles | d | m |
//! | Q5_0 / Q5_1 | block | nibble \| qh bit << 4 | d | -16 d / m |
//! | Q8_0 | block | i8 as stored | d | 0 |
//! | Q2_K | sub-block 32 | 2 bits | d (s & 15) | -dmin (s >> 4) (per 16) |
//! | Q3_K | sub-block 32 | 2 bits \| hmask << 2 | d (sc - 32) | -4 a (per 16) |
//! | Q4_K / Q5_K | sub-block 32 | nibble (\| qh << 4) | d sc | -dmin mn |
//! | Q6_K | sub-block 32 | ql \| qh << 4 | d sc | -32 a (per 16) |
//! | AWQ/GPTQ | run of 32 | nibbles | scale | -zero scale |
//!
//! Float formats (F32, F16, BF16) decode straight to `array<vec4<f32>, 8>` with `dqv(c)`.
//! `dqf(c)` gives the fully scaled f32 values for every format (the GEMM tiles use it).

use crate::formats::GgmlType;

use super::WeightKind;

/// Module-scope helpers every decoder uses.
pub fn helpers() -> &'static str {
    "fn half_at(off: u32, i: u32) -> f32 {
    let v = unpack2x16float(ws[off + (i >> 1u)]);
    return select(v.x, v.y, (i & 1u) == 1u);
}
fn spread4(x: u32) -> u32 {
    return (x & 1u) | ((x & 2u) << 7u) | ((x & 4u) << 14u) | ((x & 8u) << 21u);
}
struct QChunk {
    w: array<u32, 8>,
    a: vec2<f32>,
    b: vec2<f32>,
}
"
}

/// The WGSL text of `fn dq(c) -> QChunk` (quantized formats) or `fn dqv(c)` (float formats),
/// plus `fn dqf(c) -> array<vec4<f32>, 8>` for every format.
pub fn decoder(kind: WeightKind) -> String {
    let mut s = String::from(helpers());
    let quant = match kind {
        WeightKind::Int4 => Some(int4()),
        WeightKind::Ggml(t) => ggml(t),
    };
    match quant {
        Some(body) => {
            s.push_str(&format!("fn dq(c: u32) -> QChunk {{\n    var o: QChunk;\n{body}    return o;\n}}\n"));
            s.push_str(
                "fn dqf(c: u32) -> array<vec4<f32>, 8> {
    let q = dq(c);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) { v[i] = q.a.x * vec4<f32>(unpack4xI8(q.w[i])) + q.b.x; }
    for (var i = 4u; i < 8u; i++) { v[i] = q.a.y * vec4<f32>(unpack4xI8(q.w[i])) + q.b.y; }
    return v;
}
",
            );
        }
        None => {
            let WeightKind::Ggml(t) = kind else { unreachable!() };
            s.push_str(&float_decoder(t));
            s.push_str("fn dqf(c: u32) -> array<vec4<f32>, 8> { return dqv(c); }\n");
        }
    }
    s
}

/// Whether the format decodes through `dq` (integers plus an affine map).
pub fn is_quantized(kind: WeightKind) -> bool {
    !matches!(kind, WeightKind::Ggml(GgmlType::F32 | GgmlType::F16 | GgmlType::BF16))
}

/// Whether the affine map has a non-zero offset `b` (so kernels need the activation sums).
pub fn has_offset(kind: WeightKind) -> bool {
    is_quantized(kind) && kind != WeightKind::Ggml(GgmlType::Q8_0)
}

fn float_decoder(t: GgmlType) -> String {
    let body = match t {
        GgmlType::F32 => "    for (var i = 0u; i < 8u; i++) { v[i] = bitcast<vec4<f32>>(wv[p.qs4 + 8u * c + i]); }\n",
        GgmlType::F16 => {
            "    for (var i = 0u; i < 4u; i++) {
        let u = wv[p.qs4 + 4u * c + i];
        v[2u * i] = vec4<f32>(unpack2x16float(u.x), unpack2x16float(u.y));
        v[2u * i + 1u] = vec4<f32>(unpack2x16float(u.z), unpack2x16float(u.w));
    }\n"
        }
        _ => {
            "    for (var i = 0u; i < 4u; i++) {
        let u = wv[p.qs4 + 4u * c + i];
        let lo = bitcast<vec4<f32>>(u << vec4<u32>(16u));
        let hi = bitcast<vec4<f32>>(u & vec4<u32>(0xffff0000u));
        v[2u * i] = vec4<f32>(lo.x, hi.x, lo.y, hi.y);
        v[2u * i + 1u] = vec4<f32>(lo.z, hi.z, lo.w, hi.w);
    }\n"
        }
    };
    format!("fn dqv(c: u32) -> array<vec4<f32>, 8> {{\n    var v: array<vec4<f32>, 8>;\n{body}    return v;\n}}\n")
}

/// Nibble quants of a legacy block / int4 run held in one vec4 `q`.
const NIBBLES: &str = "    o.w[0] = q.x & 0x0F0F0F0Fu; o.w[1] = q.y & 0x0F0F0F0Fu; o.w[2] = q.z & 0x0F0F0F0Fu; o.w[3] = q.w & 0x0F0F0F0Fu;
    o.w[4] = (q.x >> 4u) & 0x0F0F0F0Fu; o.w[5] = (q.y >> 4u) & 0x0F0F0F0Fu; o.w[6] = (q.z >> 4u) & 0x0F0F0F0Fu; o.w[7] = (q.w >> 4u) & 0x0F0F0F0Fu;
";

/// Eight words from two vec4 loads `q0`, `q1`, shifted by `s` and masked with `mask`.
fn eight(s: &str, mask: &str) -> String {
    let mut t = String::new();
    for i in 0..8 {
        let (v, f) = (if i < 4 { "q0" } else { "q1" }, ["x", "y", "z", "w"][i % 4]);
        t.push_str(&format!("    o.w[{i}] = ({v}.{f} >> {s}) & {mask};\n"));
    }
    t
}

/// OR a bit plane held in `h0`, `h1` (eight words), shifted right by `s`, masked, and moved up by
/// `up`, into the quant bytes.
fn plane(s: &str, mask: &str, up: u32) -> String {
    let mut t = String::new();
    for i in 0..8 {
        let (v, f) = (if i < 4 { "h0" } else { "h1" }, ["x", "y", "z", "w"][i % 4]);
        t.push_str(&format!("    o.w[{i}] |= (({v}.{f} >> {s}) & {mask}) << {up}u;\n"));
    }
    t
}

fn int4() -> String {
    format!(
        "    let q = wv[p.qs4 + c];\n{NIBBLES}    let g = c / p.cpg;
    let d = half_at(p.dof, g);
    o.a = vec2<f32>(d);
    o.b = vec2<f32>(-half_at(p.mof, g) * d);
"
    )
}

fn ggml(t: GgmlType) -> Option<String> {
    use GgmlType::*;
    let legacy_high = "    let h = ws[p.qh + c];
    for (var i = 0u; i < 4u; i++) { o.w[i] |= spread4(h >> (4u * i)) << 4u; o.w[i + 4u] |= spread4(h >> (16u + 4u * i)) << 4u; }
";
    let kq_head = "    let g = c >> 3u;\n    let j = c & 7u;\n    let d = half_at(p.dof, g);\n";
    Some(match t {
        Q4_0 | Q4_1 | Q5_0 | Q5_1 => {
            let mut s = format!("    let q = wv[p.qs4 + c];\n{NIBBLES}    let d = half_at(p.dof, c);\n    o.a = vec2<f32>(d);\n");
            if matches!(t, Q5_0 | Q5_1) {
                s.push_str(legacy_high);
            }
            s.push_str(match t {
                Q4_0 => "    o.b = vec2<f32>(-8.0 * d);\n",
                Q5_0 => "    o.b = vec2<f32>(-16.0 * d);\n",
                _ => "    o.b = vec2<f32>(half_at(p.mof, c));\n",
            });
            s
        }
        Q8_0 => format!(
            "    let q0 = wv[p.qs4 + 2u * c];\n    let q1 = wv[p.qs4 + 2u * c + 1u];\n{}    o.a = vec2<f32>(half_at(p.dof, c));\n    o.b = vec2<f32>(0.0);\n",
            eight("0u", "0xFFFFFFFFu")
        ),
        Q2_K | Q3_K => {
            let mut s = format!(
                "{kq_head}    let qb = p.qs4 + g * 4u + ((j >> 1u) & 2u);\n    let q0 = wv[qb];\n    let q1 = wv[qb + 1u];\n{}",
                eight("(2u * (j & 3u))", "0x03030303u")
            );
            if t == Q2_K {
                s.push_str(
                    "    let sw = ws[p.sc + g * 4u + (j >> 1u)] >> (16u * (j & 1u));
    let sa = sw & 0xFFu;
    let sb = (sw >> 8u) & 0xFFu;
    let dm = half_at(p.mof, g);
    o.a = d * vec2<f32>(f32(sa & 15u), f32(sb & 15u));
    o.b = -dm * vec2<f32>(f32(sa >> 4u), f32(sb >> 4u));
",
                );
            } else {
                s.push_str(&format!("    let h0 = wv[p.qh4 + g * 2u];\n    let h1 = wv[p.qh4 + g * 2u + 1u];\n{}", plane("j", "0x01010101u", 2)));
                s.push_str(
                    "    let a0 = ws[p.sc + g * 3u];
    let a1 = ws[p.sc + g * 3u + 1u];
    let a2 = ws[p.sc + g * 3u + 2u];
    let idx = j >> 1u;
    let un = ((select(a0, a1, (idx & 1u) == 1u) >> (4u * (idx >> 1u))) & 0x0F0F0F0Fu) | (((a2 >> (2u * idx)) & 0x03030303u) << 4u);
    let sw = un >> (16u * (j & 1u));
    o.a = d * vec2<f32>(f32(i32(sw & 0xFFu) - 32), f32(i32((sw >> 8u) & 0xFFu) - 32));
    o.b = -4.0 * o.a;
",
                );
            }
            s
        }
        Q4_K | Q5_K => {
            let mut s = format!(
                "{kq_head}    let qb = p.qs4 + g * 8u + (j >> 1u) * 2u;\n    let q0 = wv[qb];\n    let q1 = wv[qb + 1u];\n{}",
                eight("(4u * (j & 1u))", "0x0F0F0F0Fu")
            );
            if t == Q5_K {
                s.push_str(&format!("    let h0 = wv[p.qh4 + g * 2u];\n    let h1 = wv[p.qh4 + g * 2u + 1u];\n{}", plane("j", "0x01010101u", 4)));
            }
            s.push_str(
                "    let w0 = ws[p.sc + g * 3u];
    let w1 = ws[p.sc + g * 3u + 1u];
    let w2 = ws[p.sc + g * 3u + 2u];
    let sh = 8u * (j & 3u);
    let lo = j < 4u;
    let scv = select(((w2 >> sh) & 15u) | (((w0 >> (sh + 6u)) & 3u) << 4u), (w0 >> sh) & 63u, lo);
    let mnv = select(((w2 >> (sh + 4u)) & 15u) | (((w1 >> (sh + 6u)) & 3u) << 4u), (w1 >> sh) & 63u, lo);
    o.a = vec2<f32>(d * f32(scv));
    o.b = vec2<f32>(-half_at(p.mof, g) * f32(mnv));
",
            );
            s
        }
        Q6_K => format!(
            "{kq_head}    let qb = p.qs4 + g * 8u + (j >> 2u) * 4u + (j & 1u) * 2u;
    let q0 = wv[qb];
    let q1 = wv[qb + 1u];
{}    let hb = p.qh4 + g * 4u + (j >> 2u) * 2u;
    let h0 = wv[hb];
    let h1 = wv[hb + 1u];
{}    let sw = ws[p.sc + g * 4u + (j >> 1u)] >> (16u * (j & 1u));
    o.a = d * vec2<f32>(f32(bitcast<i32>(sw << 24u) >> 24u), f32(bitcast<i32>(sw << 16u) >> 24u));
    o.b = -32.0 * o.a;
",
            eight("(4u * ((j >> 1u) & 1u))", "0x0F0F0F0Fu"),
            plane("(2u * (j & 3u))", "0x03030303u", 4)
        ),
        _ => return None,
    })
}
