//! Operator names and the kernel-symbol mangling of the ABI
//! (`TFL_KERNEL_SYMBOL_PREFIX` in the header, "Kernel symbols" in
//! docs/plugin-abi.md).

use crate::TFL_KERNEL_SYMBOL_PREFIX;

/// A parsed operator name: `[ns::]op[.overload]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OpName<'a> {
    /// `"aten"` when the name carries no namespace.
    pub namespace: &'a str,
    /// The operator, including a trailing `_` for in-place forms (`add_`).
    pub op: &'a str,
    /// The overload name; empty for the default overload.
    pub overload: &'a str,
}

impl OpName<'_> {
    /// Whether this names an in-place operator (`add_`, `relu_`); dunder
    /// names such as `__and__` are not in-place.
    pub fn is_inplace(&self) -> bool {
        self.op.ends_with('_') && !self.op.ends_with("__")
    }
}

impl std::fmt::Display for OpName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace != "aten" {
            write!(f, "{}::", self.namespace)?;
        }
        f.write_str(self.op)?;
        if !self.overload.is_empty() {
            write!(f, ".{}", self.overload)?;
        }
        Ok(())
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Parses `[ns::]op[.overload]`, returning why a name is malformed.
///
/// ```
/// let n = torchfl_ffi::parse_op_name("add_.Tensor").unwrap();
/// assert_eq!((n.namespace, n.op, n.overload), ("aten", "add_", "Tensor"));
/// assert!(n.is_inplace());
/// ```
pub fn parse_op_name(name: &str) -> Result<OpName<'_>, String> {
    let (namespace, rest) = match name.split_once("::") {
        Some((ns, rest)) => (ns, rest),
        None => ("aten", name),
    };
    let (op, overload) = rest.split_once('.').unwrap_or((rest, ""));
    if !is_identifier(namespace) {
        return Err(format!("namespace {namespace:?} is not an identifier"));
    }
    if !is_identifier(op) {
        return Err(format!("operator {op:?} is not an identifier"));
    }
    if !overload.is_empty() && !overload.chars().all(|c| c == '_' || c.is_ascii_alphanumeric()) {
        return Err(format!("overload {overload:?} is not made of [A-Za-z0-9_]"));
    }
    if rest.ends_with('.') {
        return Err("empty overload after '.'".to_owned());
    }
    Ok(OpName { namespace, op, overload })
}

/// The exported symbol a kernel for `name` must have:
/// `torch_fl_op_` + (`ns__` unless aten) + `op` + (`_overload` if any).
///
/// ```
/// use torchfl_ffi::kernel_symbol;
/// assert_eq!(kernel_symbol("add.Tensor").unwrap(), "torch_fl_op_add_Tensor");
/// assert_eq!(kernel_symbol("add_.Tensor").unwrap(), "torch_fl_op_add__Tensor");
/// assert_eq!(kernel_symbol("relu").unwrap(), "torch_fl_op_relu");
/// assert_eq!(kernel_symbol("sim::fused_gelu").unwrap(), "torch_fl_op_sim__fused_gelu");
/// ```
pub fn kernel_symbol(name: &str) -> Result<String, String> {
    let n = parse_op_name(name)?;
    let mut s = String::with_capacity(TFL_KERNEL_SYMBOL_PREFIX.len() + name.len() + 2);
    s.push_str(TFL_KERNEL_SYMBOL_PREFIX);
    if n.namespace != "aten" {
        s.push_str(n.namespace);
        s.push_str("__");
    }
    s.push_str(n.op);
    if !n.overload.is_empty() {
        s.push('_');
        s.push_str(n.overload);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mangles_the_documented_examples() {
        let cases = [
            ("add.Tensor", "torch_fl_op_add_Tensor"),
            ("add_.Tensor", "torch_fl_op_add__Tensor"),
            ("add.out", "torch_fl_op_add_out"),
            ("relu", "torch_fl_op_relu"),
            ("relu_", "torch_fl_op_relu_"),
            ("convolution_backward", "torch_fl_op_convolution_backward"),
            ("_foreach_add_.List", "torch_fl_op__foreach_add__List"),
            ("__and__.Tensor", "torch_fl_op___and___Tensor"),
            ("aten::mm", "torch_fl_op_mm"),
            ("sim::fused_gelu", "torch_fl_op_sim__fused_gelu"),
            ("sum.dim_IntList", "torch_fl_op_sum_dim_IntList"),
        ];
        for (name, symbol) in cases {
            assert_eq!(kernel_symbol(name).as_deref(), Ok(symbol), "{name}");
        }
    }

    #[test]
    fn in_place_detection_ignores_dunders() {
        assert!(parse_op_name("add_.Tensor").unwrap().is_inplace());
        assert!(parse_op_name("_foreach_mul_.Scalar").unwrap().is_inplace());
        assert!(!parse_op_name("__and__.Tensor").unwrap().is_inplace());
        assert!(!parse_op_name("add.out").unwrap().is_inplace());
    }

    #[test]
    fn display_round_trips() {
        for name in ["add.Tensor", "relu_", "sim::fused_gelu.default"] {
            assert_eq!(parse_op_name(name).unwrap().to_string(), name);
        }
        assert_eq!(parse_op_name("aten::mm").unwrap().to_string(), "mm");
    }

    #[test]
    fn rejects_malformed_names() {
        for bad in ["", "add.", "1add", "add-x.Tensor", "::add", "ns::", "a b", "add.Ten sor"] {
            assert!(parse_op_name(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
