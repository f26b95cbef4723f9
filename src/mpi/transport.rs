//! [`MpiTransport`]: the runtime's [`Transport`] between processes over MPI point-to-point.
//!
//! A parcel is two buffered sends with fixed tags, a header of `u64`s (edge, producer, sender,
//! send time, storage type, shape) then the values in their storage type ([`Dtype`]): `f32`s, a
//! BF16 [`Tensor`]'s BF16 bits (2 bytes a value on the wire), or `i32`/`i64` integers; MPI keeps the messages of one sender and tag in order, so a
//! header and its values stay paired. Buffered sends return at once, as the in-process channels
//! do, so the lowered schedule's order cannot deadlock two ranks that send to each other. A receive
//! takes the sender's parcels in order and keeps those wanted later in a mailbox.

use pipefill_host::runtime::{Dtype, Mailbox, Parcel, Tensor, Transport, TransportError};
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
    mailbox: Mailbox,
}

impl<'c> MpiTransport<'c> {
    /// The transport of this process over `comm`, whose process indices are the pipeline's ranks
    /// (the world, or the communicator of one replica).
    pub fn new(comm: &'c Comm) -> Self {
        MpiTransport {
            comm,
            mailbox: Mailbox::default(),
        }
    }

    /// Send-buffer bytes for `parcels` parcels of at most `values` values of at most 4 bytes
    /// (`f32`, BF16, `i32`: what stages hand on) and at most `dims` dimensions each: what [`World::reserve_send_buffer`](super::World::reserve_send_buffer) needs so that a step's sends never wait.
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
    I32(Vec<i32>),
    I64(Vec<i64>),
}

/// The wire code of a storage type (`None`: a type this wire does not know yet).
fn dtype_code(dtype: Dtype) -> Option<u64> {
    match dtype {
        Dtype::F32 => Some(0),
        Dtype::Bf16 => Some(1),
        Dtype::I32 => Some(2),
        Dtype::I64 => Some(3),
        _ => None,
    }
}

fn op_code(op: Op) -> u64 {
    u64::from(op.letter() as u8)
}

/// The header of `parcel`, the data of `edge`; `None` for a storage type the wire does not know.
fn header(edge: Edge, p: &Parcel) -> Option<Vec<u64>> {
    let flow = match edge.flow {
        Flow::Activation => 0,
        Flow::Gradient => 1,
    };
    let mut h = vec![
        flow,
        edge.from as u64,
        edge.microbatch as u64,
        op_code(p.producer.op),
        p.producer.stage as u64,
        p.producer.microbatch as u64,
        p.from as u64,
        p.sent_at.to_bits(),
        dtype_code(p.tensor.dtype())?,
        p.tensor.shape().len() as u64,
    ];
    h.extend(p.tensor.shape().iter().map(|&d| d as u64));
    Some(h)
}

/// The edge and parcel of `h` and `values`, or why they do not make one.
fn parcel(h: &[u64], values: Values) -> Result<(Edge, Parcel), String> {
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
        (2, Values::I32(v)) => Tensor::from_i32(shape, v),
        (3, Values::I64(v)) => Tensor::from_i64(shape, v),
        (code, _) => return Err(format!("storage type {code} with other values")),
    }
    .map_err(|e| e.to_string())?;
    let edge = Edge {
        flow,
        from: h[1] as usize,
        microbatch: h[2] as usize,
    };
    Ok((
        edge,
        Parcel {
            producer: Action::new(op, h[4] as usize, h[5] as usize),
            from: h[6] as usize,
            sent_at: f64::from_bits(h[7]),
            tensor,
        },
    ))
}

impl Transport for MpiTransport<'_> {
    fn send(
        &mut self,
        edge: Edge,
        to: usize,
        parcel: Parcel,
        _after: (),
    ) -> Result<(), TransportError> {
        let header = header(edge, &parcel).ok_or_else(|| TransportError::Link {
            message: format!(
                "{} holds {} values, which the MPI transport does not carry",
                edge.send(),
                parcel.tensor.dtype()
            ),
        })?;
        self.comm.send_buffered(to, HEADER, &header[..]);
        // Values go as they are stored, straight from the tensor's buffer (BF16 as its bits).
        let t = &parcel.tensor;
        if let Some(bits) = t.bf16_bits() {
            self.comm.send_buffered(to, VALUES, &bits[..]);
        } else if let Some(v) = t.as_i32() {
            self.comm.send_buffered(to, VALUES, v);
        } else if let Some(v) = t.as_i64() {
            self.comm.send_buffered(to, VALUES, v);
        } else {
            self.comm.send_buffered(to, VALUES, t.data());
        }
        Ok(())
    }

    fn recv(
        &mut self,
        edge: Edge,
        from: usize,
        _shape: Option<&[usize]>,
    ) -> Result<(Parcel, ()), TransportError> {
        let comm = self.comm;
        let parcel = self.mailbox.take(edge, || {
            let h: Vec<u64> = comm.recv_vec(from, HEADER);
            let values = match h.get(8) {
                Some(1) => Values::Bf16(comm.recv_vec(from, VALUES)),
                Some(2) => Values::I32(comm.recv_vec(from, VALUES)),
                Some(3) => Values::I64(comm.recv_vec(from, VALUES)),
                _ => Values::F32(comm.recv_vec(from, VALUES)),
            };
            parcel(&h, values).map_err(|why| TransportError::Link {
                message: format!("a message from process {from} is not a parcel: {why}"),
            })
        })?;
        Ok((parcel, ()))
    }

    /// A failed rank ends the whole job: its caller reports the error and calls
    /// [`Comm::abort`], which stops every process (none waits forever).
    fn abort(&mut self) {}

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

    /// The values `t` sends (what `send` passes to MPI): its BF16 bits for a BF16 tensor, its
    /// integers for an integer one.
    fn values(t: &Tensor) -> Values {
        if let Some(bits) = t.bf16_bits() {
            return Values::Bf16(bits);
        }
        match (t.as_i32(), t.as_i64()) {
            (Some(v), _) => Values::I32(v.to_vec()),
            (_, Some(v)) => Values::I64(v.to_vec()),
            _ => Values::F32(t.data().to_vec()),
        }
    }

    #[test]
    fn a_parcel_survives_its_header_and_values() {
        let edge = Edge {
            flow: Flow::Gradient,
            from: 3,
            microbatch: 5,
        };
        let p = Parcel {
            producer: Action::new(Op::I, 3, 5),
            from: 1,
            sent_at: 0.125,
            tensor: Tensor::new(vec![2, 2], vec![1.0, -2.0, 0.5, 3.0]).unwrap(),
        };
        assert_eq!(
            parcel(&header(edge, &p).unwrap(), values(&p.tensor)).unwrap(),
            (edge, p.clone())
        );
        let mut bad = header(edge, &p).unwrap();
        bad[3] = u64::from(b'X');
        assert!(parcel(&bad, values(&p.tensor)).is_err());
        assert!(parcel(&header(edge, &p).unwrap()[..4], Values::F32(vec![])).is_err());
        // A BF16 tensor crosses as its bits, 2 bytes a value, and arrives BF16.
        let bf16 = Parcel {
            tensor: Tensor::from_bf16(vec![1, 3], vec![0x3f80, 0xbf00, 0x4049]).unwrap(),
            ..p.clone()
        };
        let wire = values(&bf16.tensor);
        assert_eq!(wire, Values::Bf16(vec![0x3f80, 0xbf00, 0x4049]));
        assert_eq!(
            parcel(&header(edge, &bf16).unwrap(), wire).unwrap(),
            (edge, bf16.clone())
        );
        assert!(parcel(&header(edge, &bf16).unwrap(), values(&p.tensor)).is_err());
    }

    #[test]
    fn integer_tensors_cross_as_their_integers() {
        let edge = Edge {
            flow: Flow::Activation,
            from: 0,
            microbatch: 2,
        };
        for tensor in [
            Tensor::from_i64(vec![2, 3], vec![0, 1, -1, i64::MAX, i64::MIN, 1 << 40]).unwrap(),
            Tensor::from_i32(vec![3], vec![7, i32::MIN, 9]).unwrap(),
        ] {
            let p = Parcel {
                producer: Action::new(Op::F, 0, 2),
                from: 0,
                sent_at: 0.5,
                tensor,
            };
            let wire = values(&p.tensor);
            assert!(matches!(wire, Values::I32(_) | Values::I64(_)), "{wire:?}");
            let (e, back) = parcel(&header(edge, &p).unwrap(), wire).unwrap();
            assert_eq!((e, &back), (edge, &p));
            assert_eq!(back.tensor.dtype(), p.tensor.dtype());
            // Values of another type than the header names are refused.
            assert!(parcel(&header(edge, &p).unwrap(), Values::F32(vec![0.0; 6])).is_err());
        }
    }
}
