//! Tests of the schema parser (kept apart to hold `schema.rs` under the
//! file-size guideline).

use super::*;

#[test]
fn canonical_forms_parse() {
    for ok in [
        "fused_gelu(Tensor x, Tensor bias) -> Tensor",
        "sim::fused_gelu(Tensor x)->Tensor",
        "op.overload( Tensor x ,Tensor y ) -> ( Tensor , Tensor )",
        "op_(Tensor(a!) self, Scalar other=1) -> Tensor(a!)",
        "op(Tensor x, *, int[2] stride=1, float eps=1e-05, bool flag=False, str mode='mean') -> Tensor",
        "op(Tensor? w=None, int[]? dims=None, ScalarType? dtype=None, Generator? g=None) -> Tensor",
        "op(Tensor[] xs, Tensor?[] ys, SymInt[] sizes, int reduction=Mean) -> (Tensor out, Tensor idx)",
        "op(Tensor x, Layout layout=strided, MemoryFormat mf=contiguous_format, Device? d=None) -> ()",
        "op(Tensor(a!)[] xs) -> ()",
        "op(Scalar s=-.5, float f=-1.5e-3, int i=-1) -> Tensor",
        "uniform_(Tensor(a!) self, float from=0., float to=1., *, Generator? generator=None) -> Tensor(a!)",
        "grid_sampler(Tensor self, Tensor grid) -> Tensor output",
    ] {
        parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

#[test]
fn the_parts_are_read() {
    let s = parse("ns::op.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)").unwrap();
    assert_eq!((s.namespace.as_deref(), s.name.as_str(), s.overload.as_str()), (Some("ns"), "op", "out"));
    assert_eq!(s.arguments.len(), 2);
    assert!(s.arguments[1].keyword_only && s.arguments[1].alias.as_ref().unwrap().write);
    assert_eq!(s.returns.len(), 1);
    s.check_kind(false).unwrap();
    assert!(s.check_kind(true).unwrap_err().contains("infer_outputs"));
}

#[test]
fn mistakes_are_refused_with_their_column() {
    let cases = [
        ("op(Tensor x -> Tensor", "expected ',' or ')'"),
        ("op(Tensor x)", "expected '->'"),
        ("op(Tensor) -> Tensor", "expected an argument name"),
        ("op(Tensor x, Tensor x) -> Tensor", "two arguments are named 'x'"),
        ("op(Banana x) -> Tensor", "the type Banana, which the plugin ABI cannot pass"),
        ("op(Dimname[] x) -> Tensor", "the list type Dimname[]"),
        ("op(Tensor x) -> int", "tensors only"),
        ("op(int x=1.5) -> Tensor", "is not a default of type int"),
        ("op(float x=1e-880) -> Tensor", "is not a default of type float"),
        ("op(float x=1e-310) -> Tensor", "is not a default of type float"),
        ("op(int x=99999999999999999999) -> Tensor", "is not a default of type int"),
        ("op(int x=None) -> Tensor", "optional types"),
        ("op(Tensor x, *) -> Tensor", "keyword-only arguments after '*'"),
        ("op(Tensor x) -> Tensor # note", "unexpected '#'"),
        ("op(Tensor def) -> Tensor", "'def' is reserved"),
        ("op(Tensor x) -> Tensor name junk", "unexpected 'j'"),
        ("op(Tensor x, int a=1, int b) -> Tensor", "argument 'b' has no default but follows one"),
        ("op(int[](a!) xs) -> ()", "only tensors carry alias annotations"),
        ("op.a.b(Tensor x) -> Tensor", "expected '(' opening the arguments"),
        ("op(Tensor x)\n-> Tensor", "printable ASCII"),
        ("op(Tensor x) -> (Tensor a, Tensor a)", "two returns are named 'a'"),
    ];
    for (text, expected) in cases {
        let e = parse(text).expect_err(text);
        assert!(e.to_string().contains(expected), "{text}: {e}");
        assert!(e.column > 0, "{text}");
    }
}

#[test]
fn pytorch_types_map_to_kinds() {
    // Types as c10 prints them for ATen schemas (SymInt, ScalarType,
    // Layout and MemoryFormat arguments print as `int` there).
    let passable = [
        ("Tensor", Kind::Tensor),
        ("Tensor?", Kind::Tensor),
        ("Tensor[]", Kind::TensorList),
        ("Tensor?[]", Kind::OptionalTensorList),
        ("Tensor?[]?", Kind::OptionalTensorList),
        ("int", Kind::Int),
        ("int?", Kind::Int),
        ("SymInt", Kind::Int),
        ("int[]", Kind::IntList(None)),
        ("int[]?", Kind::IntList(None)),
        ("float", Kind::Float),
        ("float[]?", Kind::FloatList(None)),
        ("bool[]", Kind::BoolList(None)),
        ("Scalar?", Kind::Scalar),
        ("str?", Kind::Str),
        ("Device?", Kind::Device),
        ("Generator?", Kind::Generator),
        ("ScalarType", Kind::ScalarType),
    ];
    for (text, kind) in passable {
        assert_eq!(parse_type(text).map(|(k, _)| k), Ok(kind), "{text}");
    }
    let refused = [
        "Scalar[]",
        "Scalar?[]",
        "Tensor[][]",
        "str[]",
        "complex",
        "Dimname",
        "Storage",
        "Stream",
        "Any",
        "t",
        "t[]",
        "int64_t",
        "Dict(str, t)",
        "Future[t]",
        "(Tensor, tVal)[]",
        "__torch__.torch.classes.c10d.ProcessGroup",
        "",
    ];
    for text in refused {
        assert!(parse_type(text).is_err(), "{text:?} should be refused");
    }
}

#[test]
fn op_kinds_are_checked() {
    let check = |s: &str| parse(s).unwrap().check_kind(false);
    check("relu_(Tensor(a!) self) -> Tensor(a!)").unwrap();
    assert!(check("relu_(Tensor self) -> Tensor").unwrap_err().contains("in-place"));
    assert!(check("op(Tensor x) -> Tensor(a!)").unwrap_err().contains("no argument is annotated"));
    assert!(check("op(Tensor(a) x) -> Tensor(a)").unwrap_err().contains("view"));
    assert_eq!(parse("op(Tensor x, Tensor? y, int z) -> Tensor").unwrap().tensor_arguments(), 2);
}
