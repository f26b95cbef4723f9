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

/// The edge and parcel of header `h`, its tensor read by `values` (given the header's storage type
/// code and shape: the values follow the header on the wire), or why they do not make one.
fn parcel(
    h: &[u64],
    values: impl FnOnce(u64, Vec<usize>) -> Result<Tensor, String>,
) -> Result<(Edge, Parcel), String> {
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
    let tensor = values(h[8], shape)?;
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
            // The values are received whatever the header says, so the next parcel stays paired.
            let values = |code, shape| {
                match code {
                    1 => Tensor::from_bf16(shape, comm.recv_vec(from, VALUES)),
                    2 => Tensor::from_i32(shape, comm.recv_vec(from, VALUES)),
                    3 => Tensor::from_i64(shape, comm.recv_vec(from, VALUES)),
                    _ => Tensor::new(shape, comm.recv_vec(from, VALUES)),
                }
                .map_err(|e| e.to_string())
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

    /// The values after a header, as `recv` reads them: `t` itself, when the header's type code
    /// and shape are `t`'s (else refused, as a mismatched message would be).
    fn values(t: &Tensor) -> impl FnOnce(u64, Vec<usize>) -> Result<Tensor, String> + '_ {
        move |code, shape| {
            let same = dtype_code(t.dtype()) == Some(code);
            (same && shape == t.shape())
                .then(|| t.clone())
                .ok_or_else(|| format!("storage type {code} with other values"))
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
        let h = header(edge, &p).unwrap();
        assert_eq!(parcel(&h, values(&p.tensor)).unwrap(), (edge, p.clone()));
        let mut bad = h.clone();
        bad[3] = u64::from(b'X');
        assert!(parcel(&bad, values(&p.tensor)).is_err());
        assert!(parcel(&h[..4], values(&p.tensor)).is_err());
        // A BF16 tensor crosses as its bits, 2 bytes a value, and arrives BF16.
        let bf16 = Parcel {
            tensor: Tensor::from_bf16(vec![2, 2], vec![0x3f80, 0xbf00, 0x4049, 0]).unwrap(),
            ..p.clone()
        };
        assert_eq!(
            bf16.tensor.bf16_bits().unwrap(),
            vec![0x3f80, 0xbf00, 0x4049, 0]
        );
        let hb = header(edge, &bf16).unwrap();
        assert_eq!(hb[8], 1);
        assert_eq!(
            parcel(&hb, values(&bf16.tensor)).unwrap(),
            (edge, bf16.clone())
        );
        assert!(parcel(&hb, values(&p.tensor)).is_err());
    }

    #[test]
    fn integer_tensors_cross_as_their_integers() {
        let edge = Edge {
            flow: Flow::Activation,
            from: 0,
            microbatch: 2,
        };
        let floats = Tensor::new(vec![3], vec![0.0; 3]).unwrap();
        for (tensor, code) in [
            (
                Tensor::from_i64(vec![3], vec![i64::MAX, i64::MIN, 1 << 40]).unwrap(),
                3,
            ),
            (Tensor::from_i32(vec![3], vec![7, i32::MIN, 9]).unwrap(), 2),
        ] {
            let p = Parcel {
                producer: Action::new(Op::F, 0, 2),
                from: 0,
                sent_at: 0.5,
                tensor,
            };
            let h = header(edge, &p).unwrap();
            assert_eq!(h[8], code);
            let (e, back) = parcel(&h, values(&p.tensor)).unwrap();
            assert_eq!((e, &back), (edge, &p));
            assert_eq!(back.tensor.dtype(), p.tensor.dtype());
            // The header names the integer type, not f32.
            assert!(parcel(&h, values(&floats)).is_err());
        }
    }
}
