//! [`MpiTransport`]: the runtime's [`Transport`] between processes over MPI point-to-point.
//!
//! A parcel is two buffered sends with fixed tags, a header of `u64`s (edge, producer, sender,
//! send time, storage type, shape) then the values: `f32`s, or for a BF16 [`Tensor`] its BF16 bits
//! (2 bytes a value on the wire); MPI keeps the messages of one sender and tag in order, so a
//! header and its values stay paired. Buffered sends return at once, as the in-process channels
//! do, so the lowered schedule's order cannot deadlock two ranks that send to each other. A receive
//! takes the sender's parcels in order and keeps those wanted later in a mailbox.

use std::collections::HashMap;

use pipefill_host::cost::ActivationDtype;
use pipefill_host::runtime::{Parcel, Tensor, Transport, TransportError};
use pipefill_host::schedule::deps::{Edge, Flow};
use pipefill_host::schedule::{Action, Op};

use super::Comm;

/// Tag of a parcel's header.
const HEADER: i32 = 11;
/// Tag of a parcel's values.
const VALUES: i32 = 12;
/// Bytes MPI adds to each buffered message (`MPI_BSEND_OVERHEAD` is 96 to 128 in OpenMPI and
/// MPICH builds; more is harmless).
const MESSAGE_OVERHEAD: usize = 256;

/// One process's end of the MPI transport.
pub struct MpiTransport<'c> {
    comm: &'c Comm,
    mailbox: HashMap<Edge, Parcel>,
}

impl<'c> MpiTransport<'c> {
    /// The transport of this process over `comm`, whose process indices are the pipeline's ranks
    /// (the world, or the communicator of one replica).
    pub fn new(comm: &'c Comm) -> Self {
        MpiTransport {
            comm,
            mailbox: HashMap::new(),
        }
    }

    /// Send-buffer bytes for `parcels` parcels of at most `values` values of at most `dims`
    /// dimensions each: what [`World::reserve_send_buffer`](super::World::reserve_send_buffer) needs so that a step's sends never wait.
    pub fn buffer_bytes(parcels: usize, values: usize, dims: usize) -> usize {
        let one = 2 * MESSAGE_OVERHEAD + 8 * (HEADER_FIELDS + dims) + 4 * values;
        parcels.saturating_mul(one)
    }
}

/// `u64`s in a header before the shape.
const HEADER_FIELDS: usize = 10;

/// The values of a parcel as they cross the wire.
#[derive(Debug, Clone, PartialEq)]
enum Values {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

/// The wire code of a storage type.
fn dtype_code(dtype: ActivationDtype) -> u64 {
    match dtype {
        ActivationDtype::F32 => 0,
        ActivationDtype::Bf16 => 1,
    }
}

fn op_code(op: Op) -> u64 {
    u64::from(op.letter() as u8)
}

/// The header of `parcel`.
fn header(p: &Parcel) -> Vec<u64> {
    let flow = match p.edge.flow {
        Flow::Activation => 0,
        Flow::Gradient => 1,
    };
    let mut h = vec![
        flow,
        p.edge.from as u64,
        p.edge.microbatch as u64,
        op_code(p.producer.op),
        p.producer.stage as u64,
        p.producer.microbatch as u64,
        p.from as u64,
        p.sent_at.to_bits(),
        dtype_code(p.tensor.dtype()),
        p.tensor.shape().len() as u64,
    ];
    h.extend(p.tensor.shape().iter().map(|&d| d as u64));
    h
}

/// The parcel of `h` and `values`, or why they do not make one.
fn parcel(h: &[u64], values: Values) -> Result<Parcel, String> {
    if h.len() < HEADER_FIELDS || h.len() != HEADER_FIELDS + h[9] as usize {
        return Err(format!("a parcel header of {} fields", h.len()));
    }
    let flow = match h[0] {
        0 => Flow::Activation,
        1 => Flow::Gradient,
        f => return Err(format!("flow {f}")),
    };
    let op = u8::try_from(h[3])
        .ok()
        .and_then(|c| Op::from_letter(c as char))
        .ok_or_else(|| format!("op code {}", h[3]))?;
    let shape = h[HEADER_FIELDS..].iter().map(|&d| d as usize).collect();
    let tensor = match (h[8], values) {
        (0, Values::F32(v)) => Tensor::new(shape, v),
        (1, Values::Bf16(b)) => Tensor::from_bf16(shape, b),
        (code, _) => return Err(format!("storage type {code} with other values")),
    }
    .map_err(|e| e.to_string())?;
    Ok(Parcel {
        edge: Edge {
            flow,
            from: h[1] as usize,
            microbatch: h[2] as usize,
        },
        producer: Action::new(op, h[4] as usize, h[5] as usize),
        from: h[6] as usize,
        sent_at: f64::from_bits(h[7]),
        tensor,
    })
}

impl Transport for MpiTransport<'_> {
    fn send(&mut self, to: usize, parcel: Parcel) -> Result<(), TransportError> {
        self.comm.send_buffered(to, HEADER, &header(&parcel)[..]);
        match parcel.tensor.bf16_bits() {
            Some(bits) => self.comm.send_buffered(to, VALUES, &bits[..]),
            None => self.comm.send_buffered(to, VALUES, parcel.tensor.data()),
        }
        Ok(())
    }

    fn recv(&mut self, edge: Edge, from: usize) -> Result<Parcel, TransportError> {
        if let Some(p) = self.mailbox.remove(&edge) {
            return Ok(p);
        }
        loop {
            let h: Vec<u64> = self.comm.recv_vec(from, HEADER);
            let values = match h.get(8) {
                Some(1) => Values::Bf16(self.comm.recv_vec(from, VALUES)),
                _ => Values::F32(self.comm.recv_vec(from, VALUES)),
            };
            let p = parcel(&h, values).map_err(|why| TransportError::Lost {
                message: format!("a message from process {from} is not a parcel: {why}"),
            })?;
            if p.edge == edge {
                return Ok(p);
            }
            self.mailbox.insert(p.edge, p);
        }
    }

    /// A failed rank ends the whole job: its caller reports the error and calls
    /// [`Comm::abort`], which stops every process (none waits forever).
    fn abort(&mut self) {}

    fn aborted(&self) -> bool {
        false
    }

    fn finish(&mut self, ok: bool) -> bool {
        // A failed rank does not wait: it is about to abort the job.
        if ok {
            self.comm.barrier();
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values `t` sends (what `send` passes to MPI): its BF16 bits for a BF16 tensor.
    fn values(t: &Tensor) -> Values {
        t.bf16_bits()
            .map_or_else(|| Values::F32(t.data().to_vec()), Values::Bf16)
    }

    #[test]
    fn a_parcel_survives_its_header_and_values() {
        let p = Parcel {
            edge: Edge {
                flow: Flow::Gradient,
                from: 3,
                microbatch: 5,
            },
            producer: Action::new(Op::I, 3, 5),
            from: 1,
            sent_at: 0.125,
            tensor: Tensor::new(vec![2, 2], vec![1.0, -2.0, 0.5, 3.0]).unwrap(),
        };
        assert_eq!(parcel(&header(&p), values(&p.tensor)).unwrap(), p);
        let mut bad = header(&p);
        bad[3] = u64::from(b'X');
        assert!(parcel(&bad, values(&p.tensor)).is_err());
        assert!(parcel(&header(&p)[..4], Values::F32(vec![])).is_err());
        // A BF16 tensor crosses as its bits, 2 bytes a value, and arrives BF16.
        let bf16 = Parcel {
            tensor: Tensor::from_bf16(vec![1, 3], vec![0x3f80, 0xbf00, 0x4049]).unwrap(),
            ..p.clone()
        };
        let wire = values(&bf16.tensor);
        assert_eq!(wire, Values::Bf16(vec![0x3f80, 0xbf00, 0x4049]));
        assert_eq!(parcel(&header(&bf16), wire).unwrap(), bf16);
        assert!(parcel(&header(&bf16), values(&p.tensor)).is_err());
    }
}
