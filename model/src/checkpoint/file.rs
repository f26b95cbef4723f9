//! The rank file: one rank's stages in a small explicit binary format.
//!
//! All integers little-endian; every array is preceded by its length, so a reader checks each
//! length against what is left before it allocates:
//!
//! ```text
//! magic    8 bytes  "PFCKPT\0\x01"
//! version  u32      FORMAT_VERSION
//! rank     u32
//! step     u64      optimizer steps completed when saved
//! stages   u32
//!   stage  u32 global index, u32 optimizer steps, u32 layers
//!     layer u32 inputs, u32 outputs, u32 name length + activation name (UTF-8),
//!           6 arrays (weight, bias, weight moments 1 and 2, bias moments 1 and 2), each
//!           u64 count + count f32
//! checksum u64      FNV-1a 64 of every byte before it
//! ```

use std::path::Path;

use super::state::{LayerState, StageState};
use super::{CheckpointError, FORMAT_VERSION};

/// The first bytes of every rank file.
pub const MAGIC: [u8; 8] = *b"PFCKPT\0\x01";

/// What a rank file holds.
#[derive(Debug, Clone, PartialEq)]
pub struct RankState {
    /// The rank.
    pub rank: usize,
    /// Optimizer steps completed when saved.
    pub step: u64,
    /// The rank's stages.
    pub stages: Vec<StageState>,
}

/// FNV-1a, 64 bits: detects truncation and flipped bytes (not tampering).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The bytes of `state`'s rank file.
pub fn encode(state: &RankState) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC);
    put_u32(&mut out, FORMAT_VERSION);
    put_u32(&mut out, state.rank as u32);
    out.extend_from_slice(&state.step.to_le_bytes());
    put_u32(&mut out, state.stages.len() as u32);
    for s in &state.stages {
        put_u32(&mut out, s.stage as u32);
        put_u32(&mut out, s.steps);
        put_u32(&mut out, s.layers.len() as u32);
        for l in &s.layers {
            put_u32(&mut out, l.inputs as u32);
            put_u32(&mut out, l.outputs as u32);
            let name = l.activation.to_string();
            put_u32(&mut out, name.len() as u32);
            out.extend_from_slice(name.as_bytes());
            for a in arrays(l) {
                out.extend_from_slice(&(a.len() as u64).to_le_bytes());
                out.extend(a.iter().flat_map(|v| v.to_le_bytes()));
            }
        }
    }
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// The six arrays of a layer, in file order.
fn arrays(l: &LayerState) -> [&[f32]; 6] {
    [
        &l.weight,
        &l.bias,
        &l.weight_moments[0],
        &l.weight_moments[1],
        &l.bias_moments[0],
        &l.bias_moments[1],
    ]
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Reads a rank file's bytes (`path` only names it in errors): checks the magic, the version,
/// the checksum and every length.
pub fn decode(bytes: &[u8], path: &Path) -> Result<RankState, CheckpointError> {
    let bad = |why: String| CheckpointError::corrupt(path, why);
    if bytes.len() < MAGIC.len() + 8 {
        return Err(bad(format!(
            "{} bytes is too short for a rank file",
            bytes.len()
        )));
    }
    if bytes[..MAGIC.len()] != MAGIC {
        return Err(bad(
            "it is not a pipefill rank file (wrong magic bytes)".into()
        ));
    }
    let (body, tail) = bytes.split_at(bytes.len() - 8);
    let mut sum = [0u8; 8];
    sum.copy_from_slice(tail);
    if fnv1a(body) != u64::from_le_bytes(sum) {
        return Err(bad("checksum mismatch (truncated or damaged)".into()));
    }
    let mut r = Reader {
        bytes: body,
        at: MAGIC.len(),
    };
    let version = r.u32().map_err(&bad)?;
    if version != FORMAT_VERSION {
        return Err(bad(format!(
            "format version {version}, this build reads version {FORMAT_VERSION}"
        )));
    }
    let state = read_body(&mut r).map_err(&bad)?;
    if r.at != body.len() {
        return Err(bad(format!(
            "{} bytes left over after the last stage",
            body.len() - r.at
        )));
    }
    Ok(state)
}

/// Everything after the version.
fn read_body(r: &mut Reader<'_>) -> Result<RankState, String> {
    let rank = r.u32()? as usize;
    let step = r.u64()?;
    let stages = r.u32()?;
    let mut out = Vec::new();
    for _ in 0..stages {
        let stage = r.u32()? as usize;
        let steps = r.u32()?;
        let n = r.u32()?;
        let mut layers = Vec::new();
        for _ in 0..n {
            layers.push(read_layer(r)?);
        }
        out.push(StageState {
            stage,
            steps,
            layers,
        });
    }
    Ok(RankState {
        rank,
        step,
        stages: out,
    })
}

fn read_layer(r: &mut Reader<'_>) -> Result<LayerState, String> {
    let inputs = r.u32()? as usize;
    let outputs = r.u32()? as usize;
    let len = r.u32()? as usize;
    let name = std::str::from_utf8(r.take(len)?).map_err(|_| "activation name is not UTF-8")?;
    let activation = name
        .parse()
        .map_err(|e| format!("activation `{name}`: {e}"))?;
    let mut a: [Vec<f32>; 6] = Default::default();
    for v in a.iter_mut() {
        *v = r.f32s()?;
    }
    let [weight, bias, w1, w2, b1, b2] = a;
    Ok(LayerState {
        inputs,
        outputs,
        activation,
        weight,
        bias,
        weight_moments: [w1, w2],
        bias_moments: [b1, b2],
    })
}

/// A cursor that refuses to read past the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let left = self.bytes.len() - self.at;
        if n > left {
            return Err(format!(
                "needs {n} bytes at offset {}, only {left} are left",
                self.at
            ));
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32, String> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    fn f32s(&mut self) -> Result<Vec<f32>, String> {
        let n = self.u64()?;
        let bytes = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| format!("array of {n} values is too long"))?;
        Ok(self
            .take(bytes)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RankState {
        let layer = LayerState {
            inputs: 2,
            outputs: 3,
            activation: pipefill_kernels::Activation::Gelu,
            weight: (0..6).map(|i| i as f32 * 0.25 - 1.0).collect(),
            bias: vec![0.5, -0.5, f32::MIN_POSITIVE],
            weight_moments: [vec![1e-3; 6], vec![]],
            bias_moments: [vec![], vec![]],
        };
        RankState {
            rank: 1,
            step: 7,
            stages: vec![StageState {
                stage: 3,
                steps: 7,
                layers: vec![layer.clone(), layer],
            }],
        }
    }

    #[test]
    fn round_trips_bit_for_bit() {
        let s = sample();
        let bytes = encode(&s);
        assert_eq!(decode(&bytes, Path::new("x")).unwrap(), s);
    }

    #[test]
    fn refuses_truncated_and_damaged_files() {
        let bytes = encode(&sample());
        for n in [0, 5, 16, bytes.len() / 2, bytes.len() - 1] {
            let e = decode(&bytes[..n], Path::new("x")).unwrap_err();
            assert!(matches!(e, CheckpointError::Corrupt { .. }), "{n}: {e}");
        }
        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        let e = decode(&flipped, Path::new("x")).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
        let mut magic = bytes;
        magic[0] = b'X';
        let e = decode(&magic, Path::new("x")).unwrap_err().to_string();
        assert!(e.contains("magic"), "{e}");
    }
}
