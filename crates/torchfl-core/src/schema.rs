//! Custom-operator schemas, checked without PyTorch.
//!
//! A plugin declares each operator outside `aten` with a schema in
//! PyTorch's language (`"fused_gelu(Tensor x, Tensor bias) -> Tensor"`).
//! Registration hands it to PyTorch, but `torchfl-abi verify` has no
//! PyTorch, and both must judge a table alike. So the core parses schemas
//! itself, in the forms the plugin ABI can call:
//!
//! - argument types: `Tensor` (optionally with an alias annotation such as
//!   `Tensor(a!)`), `Tensor?`, `Tensor[]`, `Tensor?[]`, `int`, `SymInt`,
//!   `float`, `bool`, `str`, `Scalar`, `ScalarType`, `Layout`,
//!   `MemoryFormat`, `Device`, `Generator`, lists `int[]`, `SymInt[]`,
//!   `float[]`, `bool[]` (with an optional fixed size, `int[2]`), each
//!   optionally `?`;
//! - returns: tensors only (`Tensor`, `(Tensor, Tensor)`, `Tensor(a!)`), as
//!   plugin kernels write tensors only;
//! - defaults of the argument's kind (`None` for optionals only).
//!
//! Every schema accepted here is accepted by PyTorch's parser (the Python
//! tests hold the two together on PyTorch's own schemas and on mutations of
//! them). A few things PyTorch's parser tolerates are refused here because
//! they are mistakes in a plugin: duplicate argument names, a `*` without
//! keyword arguments after it, a default of another kind (`int x=1.5`),
//! comments, alias annotations on anything but tensors. Whether PyTorch knows
//! an *ATen* operator, or accepts a definition next to someone else's of the
//! same name, stays a registration-time check against the installed torch.

use std::fmt;

/// What an argument's type is, in the ABI's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `Tensor`
    Tensor,
    /// `Tensor[]`
    TensorList,
    /// `Tensor?[]`
    OptionalTensorList,
    /// `int`, `SymInt`
    Int,
    /// `float`
    Float,
    /// `bool`
    Bool,
    /// `str`
    Str,
    /// `Scalar`
    Scalar,
    /// `ScalarType`
    ScalarType,
    /// `Layout`
    Layout,
    /// `MemoryFormat`
    MemoryFormat,
    /// `Device`
    Device,
    /// `Generator`
    Generator,
    /// `int[]`, `SymInt[]`, with the fixed size when given
    IntList(Option<usize>),
    /// `float[]`
    FloatList(Option<usize>),
    /// `bool[]`
    BoolList(Option<usize>),
}

/// An alias annotation: `(a!)`, `(a)`, `(a -> *)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    /// The alias sets before any `->`, e.g. `["a"]`.
    pub sets: Vec<String>,
    /// Whether the annotation has `!`: the operator writes this tensor.
    pub write: bool,
}

/// One argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Argument {
    /// Its name.
    pub name: String,
    /// Its type.
    pub kind: Kind,
    /// `T?`
    pub optional: bool,
    /// The alias annotation of a tensor type.
    pub alias: Option<Alias>,
    /// After `*`.
    pub keyword_only: bool,
}

impl Argument {
    /// `Tensor` or `Tensor?`: what gets a gradient.
    pub fn is_tensor(&self) -> bool {
        self.kind == Kind::Tensor
    }
}

/// One return: always a tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Return {
    /// Its name, when given.
    pub name: Option<String>,
    /// Its alias annotation, e.g. `(a!)` for an in-place return.
    pub alias: Option<Alias>,
}

/// A parsed schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    /// `ns` of `ns::op`, when the schema names one.
    pub namespace: Option<String>,
    /// The operator's name.
    pub name: String,
    /// Its overload, `""` for the default.
    pub overload: String,
    /// Arguments in order.
    pub arguments: Vec<Argument>,
    /// Returns in order.
    pub returns: Vec<Return>,
}

/// Why a schema was refused: a column (1-based) and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    /// 1-based column of the problem; 0 when it concerns the whole schema.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.column == 0 {
            f.write_str(&self.message)
        } else {
            write!(f, "at column {}: {}", self.column, self.message)
        }
    }
}

/// The types the ABI can pass, for messages.
pub const PASSABLE_TYPES: &str =
    "Tensor, Tensor?, Tensor[], Tensor?[], int, SymInt, float, bool, str, Scalar, \
     ScalarType, Layout, MemoryFormat, Device, Generator and lists of int, SymInt, float and bool";

/// Words TorchScript reserves, which PyTorch refuses as argument names
/// (`from`, `to`, `try` are fine).
const RESERVED: &[&str] = &[
    "and", "as", "assert", "break", "class", "continue", "def", "del", "elif", "else", "False", "for",
    "global", "if", "import", "in", "is", "None", "not", "or", "pass", "raise", "return", "True", "while",
    "with",
];

/// ScalarType names PyTorch's parser accepts as defaults.
const SCALAR_TYPE_NAMES: &[&str] = &[
    "uint8", "int8", "int16", "int", "int32", "long", "int64", "half", "float16", "float", "float32",
    "double", "float64", "bool", "bfloat16",
];

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

type Parsed<T> = Result<T, SchemaError>;

impl<'a> Parser<'a> {
    fn error<T>(&self, message: impl Into<String>) -> Parsed<T> {
        Err(SchemaError { column: self.at + 1, message: message.into() })
    }

    fn skip_space(&mut self) {
        while self.at < self.s.len() && (self.s[self.at] == b' ' || self.s[self.at] == b'\t') {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_space();
        self.s.get(self.at).copied()
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        if self.s[self.at..].starts_with(token.as_bytes()) {
            self.at += token.len();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, token: &str, what: &str) -> Parsed<()> {
        if self.eat(token) {
            return Ok(());
        }
        let found = self.describe_next();
        self.error(format!("expected {what} but found {found}"))
    }

    fn describe_next(&mut self) -> String {
        match self.peek() {
            None => "the end of the schema".to_owned(),
            Some(b) if b.is_ascii_graphic() => format!("'{}'", b as char),
            Some(b) => format!("byte {b:#04x}"),
        }
    }

    fn ident(&mut self, what: &str) -> Parsed<String> {
        self.skip_space();
        let start = self.at;
        if matches!(self.s.get(self.at), Some(b) if b.is_ascii_alphabetic() || *b == b'_') {
            self.at += 1;
            while matches!(self.s.get(self.at), Some(b) if b.is_ascii_alphanumeric() || *b == b'_') {
                self.at += 1;
            }
            return Ok(String::from_utf8_lossy(&self.s[start..self.at]).into_owned());
        }
        let found = self.describe_next();
        self.error(format!("expected {what} but found {found}"))
    }

    fn number(&mut self) -> Parsed<String> {
        self.skip_space();
        let start = self.at;
        if self.s.get(self.at) == Some(&b'-') {
            self.at += 1;
            self.skip_space();
        }
        let digits_start = self.at;
        while matches!(self.s.get(self.at), Some(b) if b.is_ascii_digit() || *b == b'.') {
            self.at += 1;
        }
        let mantissa = &self.s[digits_start..self.at];
        if mantissa.iter().filter(|&&b| b == b'.').count() > 1 || !mantissa.iter().any(u8::is_ascii_digit) {
            self.at = start;
            return self.error("expected a number");
        }
        if matches!(self.s.get(self.at), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.s.get(self.at), Some(b'-' | b'+')) {
                self.at += 1;
            }
            if !matches!(self.s.get(self.at), Some(b) if b.is_ascii_digit()) {
                return self.error("expected the digits of an exponent");
            }
            while matches!(self.s.get(self.at), Some(b) if b.is_ascii_digit()) {
                self.at += 1;
            }
        }
        if matches!(self.s.get(self.at), Some(b) if b.is_ascii_alphanumeric() || *b == b'_') {
            return self.error("a number runs into letters");
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.at]).replace([' ', '\t'], ""))
    }

    fn string_literal(&mut self) -> Parsed<()> {
        self.skip_space();
        let Some(&quote) = self.s.get(self.at).filter(|&&b| b == b'\'' || b == b'"') else {
            return self.error("expected a quoted string");
        };
        self.at += 1;
        while let Some(&b) = self.s.get(self.at) {
            self.at += 1;
            match b {
                // The escapes every PyTorch release reads the same way.
                b'\\' => match self.s.get(self.at) {
                    Some(b'\\' | b'\'' | b'"' | b'n' | b't' | b'r') => self.at += 1,
                    _ => return self.error("an unknown escape: use \\\\, \\', \\\", \\n, \\t or \\r"),
                },
                b if b == quote => return Ok(()),
                _ => {}
            }
        }
        self.error("the string never ends")
    }

    /// `(a!)`, `(a|b)`, `(a -> *)`, `(*)`.
    fn alias(&mut self) -> Parsed<Alias> {
        let mut sets = Vec::new();
        loop {
            if self.eat("*") {
                sets.push("*".to_owned());
            } else {
                sets.push(self.ident("an alias set name such as 'a'")?);
            }
            if !self.eat("|") {
                break;
            }
        }
        let write = self.eat("!");
        if self.eat("->") {
            loop {
                if !self.eat("*") {
                    self.ident("an alias set name or '*'")?;
                }
                if !self.eat("|") {
                    break;
                }
            }
        }
        self.expect(")", "')' closing the alias annotation")?;
        Ok(Alias { sets, write })
    }

    /// A type with its alias annotation.
    fn ty(&mut self) -> Parsed<(Kind, bool, Option<Alias>)> {
        let column = self.at;
        let name = self.ident("a type")?;
        let mut alias = None;
        if self.eat("(") {
            if name != "Tensor" {
                self.at -= 1;
                return self.error(format!(
                    "only tensors carry alias annotations in a plugin schema: a kernel cannot change a {name} in place"
                ));
            }
            alias = Some(self.alias()?);
        }
        let mut list: Option<Option<usize>> = None;
        let mut optional = false;
        let mut element_optional = false;
        loop {
            if self.eat("?") {
                if optional || (list.is_none() && element_optional) {
                    return self.error("'?' twice");
                }
                if list.is_none() {
                    element_optional = true;
                } else {
                    optional = true;
                }
            } else if self.eat("[") {
                if list.is_some() {
                    return self.error("lists of lists cannot be passed to a plugin");
                }
                let size = if matches!(self.peek(), Some(b) if b.is_ascii_digit()) {
                    let n = self.number()?;
                    Some(n.parse::<usize>().or_else(|_| self.error(format!("'{n}' is not a list size")))?)
                } else {
                    None
                };
                self.expect("]", "']'")?;
                list = Some(size);
                if alias.is_none() && self.eat("(") {
                    if name != "Tensor" {
                        self.at -= 1;
                        return self.error(format!(
                            "only tensors carry alias annotations in a plugin schema: a kernel cannot change a {name}[] \
                             in place"
                        ));
                    }
                    alias = Some(self.alias()?);
                }
            } else {
                break;
            }
        }
        let not_passable = |what: String| {
            Err(SchemaError {
                column: column + 1,
                message: format!("{what}, which the plugin ABI cannot pass (it passes {PASSABLE_TYPES})"),
            })
        };
        let kind = match (name.as_str(), list, element_optional) {
            ("Tensor", None, _) => Kind::Tensor,
            ("Tensor", Some(None), false) => Kind::TensorList,
            ("Tensor", Some(None), true) => Kind::OptionalTensorList,
            ("int" | "SymInt", Some(n), false) => Kind::IntList(n),
            ("float", Some(n), false) => Kind::FloatList(n),
            ("bool", Some(n), false) => Kind::BoolList(n),
            (_, Some(_), _) => return not_passable(format!("the list type {name}[]")),
            ("int" | "SymInt", None, _) => Kind::Int,
            ("float", None, _) => Kind::Float,
            ("bool", None, _) => Kind::Bool,
            ("str", None, _) => Kind::Str,
            ("Scalar", None, _) => Kind::Scalar,
            ("ScalarType", None, _) => Kind::ScalarType,
            ("Layout", None, _) => Kind::Layout,
            ("MemoryFormat", None, _) => Kind::MemoryFormat,
            ("Device", None, _) => Kind::Device,
            ("Generator", None, _) => Kind::Generator,
            (other, None, _) => return not_passable(format!("the type {other}")),
        };
        let optional = optional || (list.is_none() && element_optional);
        if kind == Kind::Tensor && list.is_some() && element_optional && alias.is_some() {
            return self.error("an optional tensor list cannot carry an alias annotation");
        }
        Ok((kind, optional, alias))
    }

    /// A default value fitting `kind`.
    fn default(&mut self, kind: Kind, optional: bool) -> Parsed<()> {
        let column = self.at;
        if self.eat("None") {
            if optional {
                return Ok(());
            }
            self.at = column;
            return self.error("None is the default of optional types (T?) only");
        }
        let fits = match kind {
            Kind::Int => self.integer_or(&["Mean"]),
            Kind::Float => self.float(),
            Kind::Bool => self.eat("True") || self.eat("False"),
            Kind::Scalar => self.eat("True") || self.eat("False") || self.float(),
            Kind::Str | Kind::Device => self.string_literal().is_ok(),
            Kind::ScalarType => self.integer_or(SCALAR_TYPE_NAMES),
            Kind::Layout => self.integer_or(&["strided"]),
            Kind::MemoryFormat => self.integer_or(&["contiguous_format"]),
            Kind::IntList(n) => self.list_default(n, optional, |p| p.integer_or(&[])),
            Kind::FloatList(n) => self.list_default(n, optional, Self::float),
            Kind::BoolList(n) => self.list_default(n, optional, |p| p.eat("True") || p.eat("False")),
            Kind::Tensor | Kind::TensorList | Kind::OptionalTensorList | Kind::Generator => false,
        };
        if fits {
            Ok(())
        } else {
            self.at = column;
            let found = self.describe_next();
            self.error(format!("{found} is not a default of type {}", kind_name(kind)))
        }
    }

    /// A number PyTorch reads as a double: finite, and not so small that
    /// it underflows (its parser refuses both).
    fn float(&mut self) -> bool {
        let Ok(text) = self.number() else { return false };
        let mantissa = text.split(['e', 'E']).next().unwrap_or("");
        match text.parse::<f64>() {
            // Subnormal results are out of range for it too.
            Ok(v) => v.is_normal() || (v == 0.0 && !mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b))),
            Err(_) => false,
        }
    }

    fn integer_or(&mut self, names: &[&str]) -> bool {
        let start = self.at;
        if let Ok(n) = self.number() {
            if !n.contains(['.', 'e', 'E']) && n.parse::<i64>().is_ok() {
                return true;
            }
        }
        self.at = start;
        if let Ok(word) = self.ident("") {
            if names.contains(&word.as_str()) {
                return true;
            }
        }
        self.at = start;
        false
    }

    /// An optional list (`int[]?`) defaults to `None` only: PyTorch does not
    /// read a list there.
    fn list_default(
        &mut self,
        size: Option<usize>,
        optional: bool,
        item: impl Fn(&mut Self) -> bool,
    ) -> bool {
        if optional {
            return false;
        }
        if !self.eat("[") {
            // `int[2] stride=1`: a fixed-size list takes one value for all.
            return size.is_some() && item(self);
        }
        if self.eat("]") {
            return true;
        }
        loop {
            if !item(self) {
                return false;
            }
            if self.eat("]") {
                return true;
            }
            if !self.eat(",") {
                return false;
            }
        }
    }

    fn arguments(&mut self) -> Parsed<Vec<Argument>> {
        let mut args: Vec<Argument> = Vec::new();
        self.expect("(", "'(' opening the arguments")?;
        if self.eat(")") {
            return Ok(args);
        }
        let mut keyword_only = false;
        let mut seen_default = false;
        loop {
            if self.eat("*") {
                if keyword_only {
                    return self.error("'*' twice");
                }
                keyword_only = true;
                self.expect(",", "',' and keyword-only arguments after '*'")?;
                continue;
            }
            let (kind, optional, alias) = self.ty()?;
            let column = self.at;
            let name = self.ident("an argument name")?;
            if RESERVED.contains(&name.as_str()) {
                self.at = column;
                return self.error(format!("'{name}' is reserved and cannot name an argument"));
            }
            if args.iter().any(|a| a.name == name) {
                self.at = column;
                return self.error(format!("two arguments are named '{name}'"));
            }
            if self.eat("=") {
                self.default(kind, optional)?;
                seen_default = true;
            } else if seen_default && !keyword_only {
                self.at = column;
                return self.error(format!(
                    "argument '{name}' has no default but follows one that has: positional arguments with \
                     defaults come last (or put '{name}' after '*')"
                ));
            }
            args.push(Argument { name, kind, optional, alias, keyword_only });
            if self.eat(")") {
                return Ok(args);
            }
            self.expect(",", "',' or ')'")?;
        }
    }

    fn one_return(&mut self, named: bool) -> Parsed<Return> {
        let column = self.at;
        let (kind, optional, alias) = self.ty()?;
        if kind != Kind::Tensor || optional {
            self.at = column;
            return self
                .error("plugin kernels return tensors only (Tensor, or Tensor(a!) for a written argument)");
        }
        let name = if named && matches!(self.peek(), Some(b) if b.is_ascii_alphabetic() || b == b'_') {
            let column = self.at;
            let name = self.ident("a return name")?;
            if RESERVED.contains(&name.as_str()) {
                self.at = column;
                return self.error(format!("'{name}' is reserved and cannot name a return"));
            }
            Some(name)
        } else {
            None
        };
        Ok(Return { name, alias })
    }

    fn returns(&mut self) -> Parsed<Vec<Return>> {
        if !self.eat("(") {
            return Ok(vec![self.one_return(true)?]);
        }
        let mut out: Vec<Return> = Vec::new();
        if self.eat(")") {
            return Ok(out);
        }
        loop {
            let r = self.one_return(true)?;
            if let Some(name) = &r.name {
                if out.iter().any(|o| o.name.as_ref() == Some(name)) {
                    return self.error(format!("two returns are named '{name}'"));
                }
            }
            out.push(r);
            if self.eat(")") {
                return Ok(out);
            }
            self.expect(",", "',' or ')'")?;
        }
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Tensor => "Tensor",
        Kind::TensorList => "Tensor[]",
        Kind::OptionalTensorList => "Tensor?[]",
        Kind::Int => "int",
        Kind::Float => "float",
        Kind::Bool => "bool",
        Kind::Str => "str",
        Kind::Scalar => "Scalar",
        Kind::ScalarType => "ScalarType",
        Kind::Layout => "Layout",
        Kind::MemoryFormat => "MemoryFormat",
        Kind::Device => "Device",
        Kind::Generator => "Generator",
        Kind::IntList(_) => "int[]",
        Kind::FloatList(_) => "float[]",
        Kind::BoolList(_) => "bool[]",
    }
}

/// Parses `text` as a schema in the forms the plugin ABI can call.
pub fn parse(text: &str) -> Result<Schema, SchemaError> {
    if let Some(at) = text.bytes().position(|b| !(b.is_ascii_graphic() || b == b' ' || b == b'\t')) {
        return Err(SchemaError {
            column: at + 1,
            message: "only printable ASCII, spaces and tabs may appear in a schema".to_owned(),
        });
    }
    let mut p = Parser { s: text.as_bytes(), at: 0 };
    let mut name = p.ident("the operator's name")?;
    let mut namespace = None;
    if p.s[p.at..].starts_with(b"::") {
        p.at += 2;
        namespace = Some(name);
        name = p.ident("the operator's name after '::'")?;
    }
    let overload = if p.s.get(p.at) == Some(&b'.') {
        p.at += 1;
        p.ident("an overload name after '.'")?
    } else {
        String::new()
    };
    let arguments = p.arguments()?;
    p.expect("->", "'->' and the returns")?;
    let returns = p.returns()?;
    if p.peek().is_some() {
        let found = p.describe_next();
        return p.error(format!("unexpected {found} after the returns"));
    }
    Ok(Schema { namespace, name, overload, arguments, returns })
}

/// Parses one argument type, as PyTorch prints it (`"Tensor?"`, `"int[]"`,
/// `"Tensor?[]"`), returning its kind and whether it is optional: the
/// single map from schema types to ABI kinds. The C++ shim asks it for the
/// arguments of every operator it registers (ATen ones included), so a type
/// is judged the same way there and in a plugin's custom schema.
///
/// ```
/// use torchfl_core::schema::{parse_type, Kind};
/// assert_eq!(parse_type("Tensor?"), Ok((Kind::Tensor, true)));
/// assert_eq!(parse_type("SymInt[]"), Ok((Kind::IntList(None), false)));
/// assert!(parse_type("Dimname").is_err());
/// ```
pub fn parse_type(text: &str) -> Result<(Kind, bool), SchemaError> {
    if let Some(at) = text.bytes().position(|b| !b.is_ascii_graphic()) {
        return Err(SchemaError { column: at + 1, message: "a type is printable ASCII".to_owned() });
    }
    let mut p = Parser { s: text.as_bytes(), at: 0 };
    let (kind, optional, _alias) = p.ty()?;
    if p.peek().is_some() {
        let found = p.describe_next();
        return p.error(format!("unexpected {found} after the type"));
    }
    Ok((kind, optional))
}

impl Schema {
    /// Checks what a kernel behind this schema needs beyond the grammar:
    /// every written return aliases a written argument, an operator named
    /// in place (`relu_`) writes its first argument and returns it, and
    /// with `infer_outputs` every return is a fresh tensor.
    pub fn check_kind(&self, has_infer_outputs: bool) -> Result<(), String> {
        let written: Vec<&Alias> =
            self.arguments.iter().filter_map(|a| a.alias.as_ref()).filter(|a| a.write).collect();
        for (i, r) in self.returns.iter().enumerate() {
            let Some(alias) = &r.alias else { continue };
            if !alias.write {
                return Err(format!(
                    "return {i} is a view (Tensor({})) of an argument; plugin kernels cannot return views",
                    alias.sets.join("|")
                ));
            }
            if !written.iter().any(|w| w.sets == alias.sets) {
                return Err(format!(
                    "return {i} is written (Tensor({}!)) but no argument is annotated Tensor({}!)",
                    alias.sets.join("|"),
                    alias.sets.join("|")
                ));
            }
            if has_infer_outputs {
                return Err(format!(
                    "return {i} aliases an argument, but infer_outputs describes fresh outputs only: set \
                     infer_outputs to NULL for an operator that writes its arguments"
                ));
            }
        }
        if self.name.ends_with('_') && !self.name.ends_with("__") {
            let first = self.arguments.first().and_then(|a| a.alias.as_ref()).filter(|a| a.write);
            let returned =
                first.is_some_and(|w| self.returns.first().and_then(|r| r.alias.as_ref()) == Some(w));
            if !returned {
                return Err(format!(
                    "'{}' is named as an in-place operator (a trailing '_') but does not write its first argument \
                     and return it: declare it as '{}(Tensor(a!) self, ...) -> Tensor(a!)', or drop the '_'",
                    self.name, self.name
                ));
            }
        }
        Ok(())
    }

    /// Number of `Tensor`/`Tensor?` arguments: the gradients a backward
    /// returns.
    pub fn tensor_arguments(&self) -> usize {
        self.arguments.iter().filter(|a| a.is_tensor()).count()
    }
}

#[cfg(test)]
mod tests;
