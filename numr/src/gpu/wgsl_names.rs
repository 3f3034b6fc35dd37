//! Identifier-level rewriting of generated WGSL, for [`super::chain`]: which names a prelude
//! declares at module scope, and a rewrite of every identifier and every parameter read
//! (`p.<name>`) through a callback. It understands exactly what the kernel generators emit:
//! identifiers, numeric literals, comments, member accesses (`a.b`, never renamed) and struct
//! field declarations (never renamed); everything else is copied as it is.

/// One name the rewrite offers to its callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Name<'a> {
    /// An identifier that is not a member access or a struct field.
    Ident(&'a str),
    /// A parameter read `p.<name>` (the whole expression is replaced).
    Param(&'a str),
}

fn is_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_cont(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The tokens of `src` that matter here: identifiers with their byte range, and single
/// punctuation bytes; literals and comments are skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
    Ident(usize, usize),
    Punct(u8),
}

/// Scans `src`, calling `f(token, start, end)` for each identifier and punctuation byte.
fn scan(src: &str, mut f: impl FnMut(Tok)) {
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if c.is_ascii_digit() {
            let hex = c == b'0' && matches!(b.get(i + 1), Some(b'x' | b'X'));
            i += 1;
            while i < b.len() && (is_cont(b[i]) || b[i] == b'.' || (!hex && matches!(b[i], b'+' | b'-') && matches!(b[i - 1], b'e' | b'E'))) {
                i += 1;
            }
        } else if is_start(c) {
            let s = i;
            while i < b.len() && is_cont(b[i]) {
                i += 1;
            }
            f(Tok::Ident(s, i));
        } else {
            if !c.is_ascii_whitespace() {
                f(Tok::Punct(c));
            }
            i += 1;
        }
    }
}

/// Names declared at module scope in `prelude`: functions, structs, constants, aliases and
/// module-scope variables.
pub(crate) fn module_names(prelude: &str) -> Vec<String> {
    let mut names = Vec::new();
    let (mut depth, mut angle) = (0i32, 0i32);
    let mut want: Option<bool> = None; // Some(in_var): the next identifier at depth 0 is a name
    scan(prelude, |t| match t {
        Tok::Punct(b'{') | Tok::Punct(b'(') => depth += 1,
        Tok::Punct(b'}') | Tok::Punct(b')') => depth -= 1,
        Tok::Punct(b'<') if want == Some(true) => angle += 1,
        Tok::Punct(b'>') if want == Some(true) => angle -= 1,
        Tok::Ident(s, e) if depth == 0 && angle == 0 => {
            let id = &prelude[s..e];
            match (want, id) {
                (None, "fn" | "struct" | "const" | "alias" | "override") => want = Some(false),
                (None, "var") => want = Some(true),
                (Some(_), _) => {
                    names.push(id.to_string());
                    want = None;
                }
                _ => {}
            }
        }
        _ => {}
    });
    names
}

/// `src` with each identifier and parameter read replaced by `f`'s answer (unchanged where it
/// answers `None`).
pub(crate) fn rewrite(src: &str, f: &mut dyn FnMut(Name) -> Option<String>) -> String {
    // First pass: which identifiers to replace, as (start, end, replacement).
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    let mut toks: Vec<Tok> = Vec::new();
    scan(src, |t| toks.push(t));
    let b = src.as_bytes();
    let (mut depth, mut struct_depth): (i32, Option<i32>) = (0, None);
    let mut after_struct = false;
    for (j, &t) in toks.iter().enumerate() {
        match t {
            Tok::Punct(b'{') => {
                depth += 1;
                if after_struct {
                    struct_depth = Some(depth);
                    after_struct = false;
                }
            }
            Tok::Punct(b'}') => {
                if struct_depth == Some(depth) {
                    struct_depth = None;
                }
                depth -= 1;
            }
            Tok::Ident(s, e) => {
                let id = &src[s..e];
                if id == "struct" {
                    after_struct = true;
                }
                let member = j > 0 && toks[j - 1] == Tok::Punct(b'.');
                let next = toks.get(j + 1).copied();
                if member {
                    continue;
                }
                if struct_depth == Some(depth) && next == Some(Tok::Punct(b':')) {
                    continue;
                }
                if id == "p"
                    && next == Some(Tok::Punct(b'.'))
                    && let Some(Tok::Ident(ms, me)) = toks.get(j + 2).copied()
                    && b[e..ms].iter().all(|c| c.is_ascii_whitespace() || *c == b'.')
                {
                    if let Some(r) = f(Name::Param(&src[ms..me])) {
                        edits.push((s, me, r));
                    }
                    continue;
                }
                if let Some(r) = f(Name::Ident(id)) {
                    edits.push((s, e, r));
                }
            }
            _ => {}
        }
    }
    let mut out = String::with_capacity(src.len() + edits.len() * 4);
    let mut at = 0;
    for (s, e, r) in edits {
        if s < at {
            continue; // the member after `p.` was already replaced with it
        }
        out.push_str(&src[at..s]);
        out.push_str(&r);
        at = e;
    }
    out.push_str(&src[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_of_a_prelude() {
        let pre = "struct Q { w: array<u32, 8>, a: vec2<f32> }\nvar<workgroup> red: array<f32, 4>;\nconst K: u32 = 32u;\nfn dq(i: u32) -> Q { var q: Q; let x = vec2<f32>(1.0); return q; }\n";
        assert_eq!(module_names(pre), vec!["Q", "red", "K", "dq"]);
    }

    #[test]
    fn rewrite_skips_members_fields_literals_and_comments() {
        let src = "struct Q { y: f32 }\n// y is a comment\nfn f() { let v = y[p.cpr - 1u] + 1e-5 + q.y + 0x1Fu; red[0] = p . eps; }";
        let out = rewrite(src, &mut |n| match n {
            Name::Ident("y") => Some("b3".into()),
            Name::Ident("red") => Some("s1_red".into()),
            Name::Param(x) => Some(format!("p.s1_{x}")),
            _ => None,
        });
        assert_eq!(out, "struct Q { y: f32 }\n// y is a comment\nfn f() { let v = b3[p.s1_cpr - 1u] + 1e-5 + q.y + 0x1Fu; s1_red[0] = p.s1_eps; }");
    }
}
