//! The guides' Rust blocks that are not compiled as doctests (`rust,ignore`: they need a
//! feature's whole service around them) are excerpts of an example, which CI builds and runs:
//! each names its example on its first line, and its lines are that example's, in order.

use std::path::Path;

/// The `rust,ignore` blocks of `text`: each block's lines.
fn ignored_blocks(text: &str) -> Vec<Vec<&str>> {
    let mut blocks = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "```rust,ignore" {
            blocks.push(lines.by_ref().take_while(|l| l.trim() != "```").collect());
        }
    }
    blocks
}

/// Whether `excerpt`'s lines (trimmed) appear in `file`'s lines, contiguous and in order.
fn is_excerpt_of(excerpt: &[&str], file: &str) -> bool {
    let file: Vec<&str> = file.lines().map(str::trim).collect();
    let excerpt: Vec<&str> = excerpt.iter().map(|l| l.trim()).collect();
    file.windows(excerpt.len()).any(|w| w == excerpt.as_slice())
}

#[test]
fn every_uncompiled_guide_snippet_is_an_excerpt_of_an_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for block in ignored_blocks(&text) {
            let name = block
                .first()
                .and_then(|l| l.trim().strip_prefix("// examples/"))
                .unwrap_or_else(|| {
                    panic!(
                        "{}: a `rust,ignore` block must start with `// examples/NAME.rs`, the \
                         example it is taken from (or be compiled as a doctest): {block:?}",
                        page.display()
                    )
                });
            let example = std::fs::read_to_string(root.join("examples").join(name))
                .unwrap_or_else(|e| panic!("{}: example {name}: {e}", page.display()));
            assert!(
                is_excerpt_of(&block[1..], &example),
                "{}: this block is not a part of examples/{name} as it is now:\n{}",
                page.display(),
                block[1..].join("\n")
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 2,
        "the grpc and actix excerpts of docs/2 were not found"
    );
}
