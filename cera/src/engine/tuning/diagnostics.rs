//! [`Diagnostics`]: switches for measuring the GPU decode step, never for use. Ablation makes
//! the generated tokens wrong on purpose; tracing and the chains' report print to standard
//! error. They live apart from [`super::GpuTuning`] (in
//! [`LoadOptions::measuring_only`](super::super::LoadOptions::measuring_only)) so that no
//! ordinary setting reaches them; the CLI sets them with `--diag KEY=VALUE`
//! ([`super::DIAGNOSTIC_KEYS`]).

use super::keys::{Value, split_pair};
use super::{DIAGNOSTIC_KEYS, TuningError};

/// One ablation rule: the decode dispatches whose kernel name contains `kernel` are dropped or
/// recorded twice in a row.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AblateRule {
    /// A part of the kernel name.
    pub kernel: String,
    /// `true`: record each such dispatch twice (the cost of one more dependent copy); `false`:
    /// drop it.
    pub twice: bool,
}

/// For measuring only: ablation makes the output wrong. Default: all off.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Diagnostics {
    /// What each kernel family costs inside the real decode chain, for timing only (the
    /// generated tokens are wrong while any rule is set). The profile (`cera bench --profile`)
    /// serialises every dispatch around timestamps, so it overstates small kernels and says
    /// nothing of the drain and ramp between dependent ones; these rules change the decode
    /// plan instead, and the bench's tok/s difference is the family's cost in place. The first
    /// rule whose name a kernel's contains applies. `--diag ablate=+attn_decode` or
    /// `ablate=-attn_decode,+_epglu`.
    pub ablate: Vec<AblateRule>,
    /// Where a decode loop's host time goes: per generation, the host's recording and submit,
    /// the time blocked in the readback, the period between two readbacks, and the readbacks
    /// that had to wait for all queued work, printed to standard error (`step_trace=1`).
    pub step_trace: bool,
    /// Print the decode plan's chains and why a run was left unchained (`chain_verbose=1`).
    pub chain_verbose: bool,
}

impl Diagnostics {
    /// Sets the switch named `key` ([`DIAGNOSTIC_KEYS`]) from `value`.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), TuningError> {
        let key = key.trim().to_ascii_lowercase();
        let v = Value::of(DIAGNOSTIC_KEYS, &key, value.trim())?;
        match v.key {
            "ablate" => {
                let mut rules = Vec::new();
                for r in v.value.split(',').map(str::trim).filter(|r| !r.is_empty()) {
                    let (twice, name) = match r.as_bytes()[0] {
                        b'+' => (true, &r[1..]),
                        b'-' => (false, &r[1..]),
                        _ => return Err(v.bad()),
                    };
                    if name.is_empty() {
                        return Err(v.bad());
                    }
                    rules.push(AblateRule { kernel: name.to_string(), twice });
                }
                self.ablate = rules;
            }
            "step_trace" => self.step_trace = v.flag()?,
            _ => self.chain_verbose = v.flag()?,
        }
        Ok(())
    }

    /// [`Self::set`] from one `KEY=VALUE` string.
    pub fn set_pair(&mut self, pair: &str) -> Result<(), TuningError> {
        let (k, v) = split_pair(pair)?;
        self.set(&k, v)
    }
}
