//! Helpers shared by the integration tests: a simulator instance with
//! typed upload/download, host-side tensors of `f64` values placed in device
//! memory with arbitrary layouts, and the kernel launcher.
#![allow(unreachable_pub, dead_code, missing_debug_implementations, clippy::unwrap_used, clippy::expect_used)]

use half::{bf16, f16};
use torchfl_sim::{
    Arg, Call, Config, DType, Mode, Result, Rng, Runtime, Scalar, StreamHandle, TensorArg, TensorData,
};

pub const FLOATS: [DType; 4] = [DType::Float32, DType::Float64, DType::Float16, DType::BFloat16];
pub const INTS: [DType; 5] = [DType::Int64, DType::Int32, DType::Int16, DType::Int8, DType::UInt8];

pub fn numeric() -> Vec<DType> {
    FLOATS.iter().chain(INTS.iter()).copied().collect()
}

/// Encodes `v` as one element of `dtype` (PyTorch's conversion).
pub fn encode(dtype: DType, v: f64, out: &mut Vec<u8>) {
    match dtype {
        DType::Bool => out.push(u8::from(v != 0.0)),
        DType::UInt8 => out.push(v as i64 as u8),
        DType::Int8 => out.extend((v as i64 as i8).to_ne_bytes()),
        DType::Int16 => out.extend((v as i64 as i16).to_ne_bytes()),
        DType::Int32 => out.extend((v as i64 as i32).to_ne_bytes()),
        DType::Int64 => out.extend((v as i64).to_ne_bytes()),
        DType::Float16 => out.extend(f16::from_f32(v as f32).to_bits().to_ne_bytes()),
        DType::BFloat16 => out.extend(bf16::from_f32(v as f32).to_bits().to_ne_bytes()),
        DType::Float32 => out.extend((v as f32).to_ne_bytes()),
        DType::Float64 => out.extend(v.to_ne_bytes()),
    }
}

/// Decodes element `i` of a `dtype` buffer.
pub fn decode(dtype: DType, bytes: &[u8], i: usize) -> f64 {
    let n = dtype.itemsize();
    let b = &bytes[i * n..(i + 1) * n];
    match dtype {
        DType::Bool => f64::from(u8::from(b[0] != 0)),
        DType::UInt8 => f64::from(b[0]),
        DType::Int8 => f64::from(b[0] as i8),
        DType::Int16 => f64::from(i16::from_ne_bytes([b[0], b[1]])),
        DType::Int32 => f64::from(i32::from_ne_bytes(b.try_into().unwrap())),
        DType::Int64 => i64::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::Float16 => f16::from_bits(u16::from_ne_bytes([b[0], b[1]])).to_f64(),
        DType::BFloat16 => bf16::from_bits(u16::from_ne_bytes([b[0], b[1]])).to_f64(),
        DType::Float32 => f64::from(f32::from_ne_bytes(b.try_into().unwrap())),
        DType::Float64 => f64::from_ne_bytes(b.try_into().unwrap()),
    }
}

/// Rounds `v` to what storing it in `dtype` gives.
pub fn round_to(dtype: DType, v: f64) -> f64 {
    let mut b = Vec::new();
    encode(dtype, v, &mut b);
    decode(dtype, &b, 0)
}

/// How a tensor is laid out in device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Row-major.
    Contiguous,
    /// Column-major (every dimension reversed in memory, like `.t()`).
    Transposed,
    /// Every other element along each dimension, plus a byte offset.
    Strided,
}

pub const LAYOUTS: [Layout; 3] = [Layout::Contiguous, Layout::Transposed, Layout::Strided];

/// A host tensor of logical values.
#[derive(Debug, Clone, PartialEq)]
pub struct HTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl HTensor {
    pub fn new(dtype: DType, shape: &[usize], f: impl Fn(usize) -> f64) -> Self {
        let n: usize = shape.iter().product();
        Self { dtype, shape: shape.to_vec(), data: (0..n).map(|i| round_to(dtype, f(i))).collect() }
    }
    pub fn numel(&self) -> usize {
        self.data.len()
    }
    /// Row-major multi-index of linear index `i`.
    pub fn index(&self, mut i: usize) -> Vec<usize> {
        let mut idx = vec![0; self.shape.len()];
        for d in (0..self.shape.len()).rev() {
            idx[d] = i % self.shape[d];
            i /= self.shape[d];
        }
        idx
    }
    /// The value at `idx` broadcast from a larger shape (trailing alignment).
    pub fn at_broadcast(&self, idx: &[usize]) -> f64 {
        let lead = idx.len() - self.shape.len();
        let mut lin = 0;
        for d in 0..self.shape.len() {
            let i = if self.shape[d] == 1 { 0 } else { idx[lead + d] };
            lin = lin * self.shape[d] + i;
        }
        self.data[lin]
    }
}

/// A device tensor with the allocation that backs it.
pub struct DTensor {
    pub arg: TensorArg,
    pub ptr: u64,
}

pub struct Sim {
    pub rt: Runtime,
    pub stream: StreamHandle,
}

impl Sim {
    pub fn new(mode: Mode) -> Self {
        Self::with(Config { devices: 2, memory: 1 << 30, mode, strict: false, ..Config::default() })
    }
    pub fn with(config: Config) -> Self {
        let rt = Runtime::new(config).unwrap();
        let stream = rt.default_stream(0).unwrap();
        Self { rt, stream }
    }

    /// Places `t` on device 0 with `layout`.
    pub fn place(&self, t: &HTensor, layout: Layout) -> DTensor {
        self.place_on(0, t, layout)
    }

    pub fn place_on(&self, device: usize, t: &HTensor, layout: Layout) -> DTensor {
        let nd = t.shape.len();
        let mut strides = vec![0i64; nd];
        let (step, offset) = match layout {
            Layout::Strided => (2i64, 3usize),
            _ => (1, 0),
        };
        let mut s = step;
        let order: Vec<usize> = match layout {
            Layout::Transposed => (0..nd).collect(),
            _ => (0..nd).rev().collect(),
        };
        for d in order {
            strides[d] = s;
            s *= (t.shape[d].max(1) as i64) * if layout == Layout::Strided { 2 } else { 1 };
        }
        let span: usize =
            t.shape.iter().zip(&strides).map(|(&n, &st)| n.saturating_sub(1) * st as usize).sum::<usize>()
                + 1
                + offset;
        let item = t.dtype.itemsize();
        let mut bytes = vec![0u8; span * item];
        for i in 0..t.numel() {
            let idx = t.index(i);
            let pos = offset + idx.iter().zip(&strides).map(|(&x, &s)| x * s as usize).sum::<usize>();
            let mut b = Vec::new();
            encode(t.dtype, t.data[i], &mut b);
            bytes[pos * item..(pos + 1) * item].copy_from_slice(&b);
        }
        let ptr = self.rt.allocate(device, bytes.len()).unwrap();
        self.rt.copy_to_device(device, ptr, &bytes, None).unwrap();
        DTensor {
            arg: TensorArg {
                dtype: t.dtype,
                shape: t.shape.iter().map(|&s| s as i64).collect(),
                strides,
                data: TensorData::Device { device, ptr, byte_offset: (offset * item) as u64 },
            },
            ptr,
        }
    }

    /// An output tensor (zero-filled, or `layout`).
    pub fn empty(&self, dtype: DType, shape: &[usize], layout: Layout) -> DTensor {
        self.place(&HTensor::new(dtype, shape, |_| 0.0), layout)
    }

    /// Reads a device tensor back as logical values (synchronizes device 0
    /// first, so pending work is visible).
    pub fn read(&self, t: &DTensor) -> HTensor {
        let TensorData::Device { device, ptr, byte_offset } = t.arg.data else {
            panic!("not a device tensor");
        };
        self.rt.synchronize_device(device).unwrap();
        let shape: Vec<usize> = t.arg.shape.iter().map(|&s| s as usize).collect();
        let n: usize = shape.iter().product();
        let item = t.arg.dtype.itemsize();
        let mut out = HTensor { dtype: t.arg.dtype, shape: shape.clone(), data: vec![0.0; n] };
        if n == 0 {
            return out;
        }
        let span =
            1 + shape.iter().zip(&t.arg.strides).map(|(&n, &s)| n.saturating_sub(1) as i64 * s).sum::<i64>()
                as usize;
        let mut bytes = vec![0u8; span * item];
        self.rt.copy_to_host(device, ptr + byte_offset, &mut bytes).unwrap();
        for i in 0..n {
            let idx = out.index(i);
            let pos: i64 = idx.iter().zip(&t.arg.strides).map(|(&x, &s)| x as i64 * s).sum();
            out.data[i] = decode(t.arg.dtype, &bytes, pos as usize);
        }
        out
    }

    /// Launches `op` on the default stream of device 0.
    pub fn call(&self, op: &str, args: Vec<Arg>, outputs: Vec<TensorArg>) -> Result<()> {
        self.call_on(self.stream, op, args, outputs)
    }

    pub fn call_on(
        &self,
        stream: StreamHandle,
        op: &str,
        args: Vec<Arg>,
        outputs: Vec<TensorArg>,
    ) -> Result<()> {
        self.rt.launch(
            op,
            &Call { op_name: op.to_owned(), device: 0, stream, args, outputs, rng: Rng::default() },
        )
    }
}

pub fn t(d: &DTensor) -> Arg {
    Arg::Tensor(d.arg.clone())
}

pub fn scalar_f(v: f64) -> Arg {
    Arg::Scalar(Scalar::Float(v))
}

pub fn scalar_i(v: i64) -> Arg {
    Arg::Scalar(Scalar::Int(v))
}

/// Tolerance for comparing results stored in `dtype`.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::Float16 => 2e-3,
        DType::BFloat16 => 1.6e-2,
        DType::Float32 => 2e-6,
        DType::Float64 => 1e-12,
        _ => 0.0,
    }
}

pub fn assert_close(got: &HTensor, expected: &[f64], what: &str) {
    assert_eq!(got.data.len(), expected.len(), "{what}: length");
    let tol = tol(got.dtype);
    for (i, (&g, &e)) in got.data.iter().zip(expected).enumerate() {
        let ok = if e.is_nan() { g.is_nan() } else { (g - e).abs() <= tol * e.abs().max(1.0) };
        assert!(ok, "{what}: element {i}: got {g}, expected {e} ({:?})", got.dtype);
    }
}

/// Turns a plugin status into `Ok` or `(code, message)`, destroying the
/// error (for the tests that call the C ABI).
pub fn st(
    api: &torchfl_ffi::TFL_PluginApi,
    e: *mut torchfl_ffi::TFL_Error,
) -> std::result::Result<(), (i32, String)> {
    if e.is_null() {
        return Ok(());
    }
    // SAFETY: a non-NULL error from this plugin, destroyed once, last.
    unsafe {
        let code = api.error_code.unwrap()(e);
        let msg = std::ffi::CStr::from_ptr(api.error_message.unwrap()(e)).to_string_lossy().into_owned();
        api.error_destroy.unwrap()(e);
        Err((code, msg))
    }
}
