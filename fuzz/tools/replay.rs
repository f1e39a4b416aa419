//! Runs one input file through one fuzz target without the fuzzer, for triage. Run from the
//! repository root:
//!
//! ```sh
//! IDEMSTORE_FUZZ_TRACE=1 cargo run --manifest-path fuzz/Cargo.toml --bin replay -- \
//!     ops fuzz/artifacts/ops/crash-…
//! ```
//!
//! With `IDEMSTORE_FUZZ_TRACE=1` the `ops` target prints every step and the model. Exits
//! non-zero when the input fails (a panic) or the arguments are wrong.

// The harness shared with the crate's tests; this tool uses part of it.
#[allow(dead_code, unused_imports)]
#[path = "../../tests/support/mod.rs"]
mod support;

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [target, file] = args.as_slice() else {
        eprintln!("usage: replay <decode|open|ops> <input file>");
        return std::process::ExitCode::from(2);
    };
    let data = match std::fs::read(file) {
        Ok(data) => data,
        Err(e) => {
            eprintln!("reading {file}: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match support::fuzz::replay(target, &data) {
        Ok(()) => {
            println!("{target}: {file} ran to the end");
            std::process::ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("{message}");
            std::process::ExitCode::from(2)
        }
    }
}
