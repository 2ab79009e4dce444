"""A recursive-descent parser for the CEL grammar (cel-spec `langdef.md`), with optional syntax and macros.

Macros (has, all, exists, exists_one, map, filter, cel.bind, two-variable comprehensions, optMap, optFlatMap,
sortBy) are expanded here, as cel-go's parser does, so later stages see dedicated nodes.
"""

from __future__ import annotations

import math
import re
from typing import Final

from dra_driver.cel import ast
from dra_driver.cel.errors import CelCompileError
from dra_driver.cel.values import UInt

_TOKEN_RE: Final = re.compile(
    r"""
    (?P<ws>[ \t\r\n\f]+|//[^\n]*)
  | (?P<float>(?:[0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+|\.[0-9]+(?:[eE][+-]?[0-9]+)?))
  | (?P<hex>0x[0-9a-fA-F]+[uU]?)  # cel-go's lexer: lower-case 0x only
  | (?P<int>[0-9]+[uU]?)
  | (?P<string>[bB]?[rR]  # raw (bytes: b before r): a backslash is itself, so it cannot hold its own quote
        (?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"[^"\n]*"|'[^'\n]*')
      | [bB]?(?:\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<escident>`[A-Za-z0-9_./ -]+`)  # the grammar's ESC_IDENTIFIER: a field name in backquotes
  | (?P<op>\.\?|\[\?|==|!=|<=|>=|&&|\|\||[-+*/%!<>?:.,()\[\]{}])
    """,
    re.VERBOSE | re.DOTALL,
)
_RESERVED: Final = frozenset(
    [
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    ]
)
_RELATIONS: Final = {"<": "_<_", "<=": "_<=_", ">": "_>_", ">=": "_>=_", "==": "_==_", "!=": "_!=_", "in": "@in"}
_ESCAPES: Final = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "\\": "\\", "'": "'", '"': '"', "`": "`", "?": "?",
}  # fmt: skip
_INT64_MAX: Final = 2**63 - 1
ACCUMULATOR: Final = "__result__"  # cel-go's comprehension accumulator (parser.AccumulatorName)
MAX_RECURSION_DEPTH: Final = 250  # cel-go's parser default
_UINT64_MAX: Final = 2**64 - 1


class Token:
    __slots__ = ("kind", "pos", "text")

    def __init__(self, kind: str, text: str, pos: int) -> None:
        self.kind, self.text, self.pos = kind, text, pos


def format_error(source: str, pos: int, message: str) -> str:
    """cel-go's issue format: `ERROR: <input>:line:col: message` followed by the line and a caret."""
    line_no = source.count("\n", 0, pos) + 1
    line_start = source.rfind("\n", 0, pos) + 1
    line_end = source.find("\n", pos)
    line = source[line_start : line_end if line_end >= 0 else len(source)]
    col = pos - line_start
    return f"ERROR: <input>:{line_no}:{col + 1}: {message}\n | {line}\n | {'.' * col}^"


def _tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(source):
        match = _TOKEN_RE.match(source, pos)
        if match is None:
            raise CelCompileError(
                format_error(source, pos, f"Syntax error: token recognition error at: '{_unrecognized(source, pos)}'")
            )
        kind = match.lastgroup or ""
        if kind != "ws":
            tokens.append(Token(kind, match.group(), pos))
        pos = match.end()
    tokens.append(Token("eof", "", len(source)))
    return tokens


def _unrecognized(source: str, pos: int) -> str:
    """The text ANTLR's lexer names in a token recognition error: what it read of the longest token it tried, up to
    and including the character that failed it (an escaped identifier: `` `a+ ``, ``` `` ```, or to the end)."""
    if source[pos] != "`":
        return source[pos]
    end = pos + 1
    while end < len(source) and source[end] != "`" and _ESC_IDENT_CHAR.match(source[end]):
        end += 1
    return source[pos : end + 1]


_ESC_IDENT_CHAR: Final = re.compile(r"[A-Za-z0-9_./ -]")


def _unescape(body: str, raw: bool, as_bytes: bool) -> str | bytes:
    if raw:
        return body.encode() if as_bytes else body
    chunks: list[bytes] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            chunks.append(ch.encode())
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _ESCAPES:
            chunks.append(_ESCAPES[nxt].encode())
            i += 2
        elif nxt in "xX":
            code = int(_digits(body, i + 2, 2, "0123456789abcdefABCDEF"), 16)
            chunks.append(bytes([code]) if as_bytes else chr(code).encode())
            i += 4
        elif nxt in "uU":
            if as_bytes:
                raise ValueError("unicode escape in a bytes literal")
            width = 4 if nxt == "u" else 8
            chunks.append(chr(int(_digits(body, i + 2, width, "0123456789abcdefABCDEF"), 16)).encode())
            i += 2 + width
        elif nxt in "0123":
            code = int(_digits(body, i + 1, 3, "01234567"), 8)
            chunks.append(bytes([code]) if as_bytes else chr(code).encode())
            i += 4
        else:
            raise ValueError(f"invalid escape sequence \\{nxt}")
    data = b"".join(chunks)
    return data if as_bytes else data.decode("utf-8", errors="surrogatepass")


def _digits(body: str, start: int, count: int, allowed: str) -> str:
    """Exactly `count` digits of an escape (cel-go's lexer takes nothing shorter: `\\u00` is no token)."""
    digits = body[start : start + count]
    if len(digits) != count or any(c not in allowed for c in digits):
        raise ValueError(f"invalid escape sequence {body[start - 1 : start + count]!r}")
    return digits


class Parser:
    def __init__(self, source: str, escaped_fields: bool = True) -> None:
        self.source = source
        self.escaped_fields = escaped_fields
        self.tokens = _tokenize(source)
        self.i = 0
        self.expr_depth = 0

    # -- token helpers -------------------------------------------------------------------------------------------
    def _peek(self) -> Token:
        return self.tokens[self.i]

    def _next(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def _accept(self, text: str) -> bool:
        tok = self.tokens[self.i]
        if tok.kind in ("op", "ident") and tok.text == text:
            self.i += 1
            return True
        return False

    def _expect(self, text: str) -> Token:
        tok = self._peek()
        if not self._accept(text):
            self._fail(tok, f"Syntax error: mismatched input '{tok.text or '<EOF>'}' expecting '{text}'")
        return tok

    def _fail(self, tok: Token | int, message: str) -> None:
        pos = tok if isinstance(tok, int) else tok.pos
        raise CelCompileError(format_error(self.source, pos, message))

    # -- grammar -------------------------------------------------------------------------------------------------
    def parse(self) -> ast.Node:
        node = self._expr()
        tok = self._peek()
        if tok.kind != "eof":
            self._fail(tok, f"Syntax error: extraneous input '{tok.text}' expecting <EOF>")
        if visitor_depth(node) > MAX_RECURSION_DEPTH:
            raise CelCompileError("ERROR: <input>:-1:0: max recursion depth exceeded")
        return node

    def _expr(self) -> ast.Node:
        # ANTLR's own listener limits each grammar rule's nesting; `expr` (parentheses, arguments) is the one
        # that a real expression reaches.
        self.expr_depth += 1
        if self.expr_depth > MAX_RECURSION_DEPTH:
            raise CelCompileError(f"ERROR: <input>:-1:0: expression recursion limit exceeded: {MAX_RECURSION_DEPTH}")
        try:
            cond = self._or()
            tok = self._peek()
            if self._accept("?"):
                then = self._or()
                self._expect(":")
                other = self._expr()
                return ast.Call(tok.pos, "_?_:_", (cond, then, other))
            return cond
        finally:
            self.expr_depth -= 1

    def _or(self) -> ast.Node:
        node = self._and()
        while (tok := self._peek()).text == "||" and tok.kind == "op":
            self.i += 1
            node = ast.Call(tok.pos, "_||_", (node, self._and()))
        return node

    def _and(self) -> ast.Node:
        node = self._relation()
        while (tok := self._peek()).text == "&&" and tok.kind == "op":
            self.i += 1
            node = ast.Call(tok.pos, "_&&_", (node, self._relation()))
        return node

    def _relation(self) -> ast.Node:
        node = self._addition()
        while (tok := self._peek()).text in _RELATIONS and tok.kind in ("op", "ident"):
            self.i += 1
            node = ast.Call(tok.pos, _RELATIONS[tok.text], (node, self._addition()))
        return node

    def _addition(self) -> ast.Node:
        node = self._multiplication()
        while (tok := self._peek()).kind == "op" and tok.text in ("+", "-"):
            self.i += 1
            node = ast.Call(tok.pos, f"_{tok.text}_", (node, self._multiplication()))
        return node

    def _multiplication(self) -> ast.Node:
        node = self._unary()
        while (tok := self._peek()).kind == "op" and tok.text in ("*", "/", "%"):
            self.i += 1
            node = ast.Call(tok.pos, f"_{tok.text}_", (node, self._unary()))
        return node

    def _unary(self) -> ast.Node:
        tok = self._peek()
        if tok.kind != "op" or tok.text not in ("!", "-"):
            return self._member()
        count = 0  # the grammar takes a run of one operator greedily: `--1` is two negations of 1
        while (nxt := self._peek()).kind == "op" and nxt.text == tok.text:
            self.i += 1
            count += 1
        if tok.text == "-" and count == 1 and nxt.kind in ("int", "hex", "float") and not nxt.text.endswith(("u", "U")):
            self.i += 1  # fold "-literal" so that -9223372036854775808 is representable
            return self._member_suffix(self._number(nxt, negative=True))
        operand = self._unary()
        if count % 2 == 0:  # cel-go drops an even run (`!!x` is `x`), which the cost counts
            return operand
        return ast.Call(tok.pos, f"{tok.text}_", (operand,))

    def _member(self) -> ast.Node:
        return self._member_suffix(self._primary())

    def _member_suffix(self, node: ast.Node) -> ast.Node:
        while True:
            tok = self._peek()
            if tok.kind != "op":
                return node
            if tok.text in (".", ".?"):
                self.i += 1
                name = self._field()
                paren = self._peek()
                if tok.text == "." and paren.text == "(" and paren.kind == "op" and name.kind == "ident":
                    self.i += 1
                    node = self._call(name.text, self._args(")"), node, paren.pos)  # cel-go: a call is at '('
                else:
                    node = ast.Select(tok.pos, node, name.text, optional=tok.text == ".?")
            elif tok.text in ("[", "[?"):
                self.i += 1
                index = self._expr()
                self._expect("]")
                node = ast.Index(tok.pos, node, index, optional=tok.text == "[?")
            else:
                return node

    def _field(self) -> Token:
        """A field name after `.`, `.?` or in a message literal, which may be escaped in backquotes (`` a.`b-c` ``):
        cel-go's parser takes these since 0.29 (Kubernetes 1.37); 0.26's lexes them but refuses them."""
        tok = self._peek()
        if tok.kind != "escident":
            return self._ident()
        if not self.escaped_fields:
            self._fail(tok, "unsupported syntax: '`'")
        self.i += 1
        return Token("escident", tok.text[1:-1], tok.pos)

    def _ident(self) -> Token:
        tok = self._next()
        if tok.kind != "ident" or tok.text in ("true", "false", "null", "in"):
            self._fail(tok, f"Syntax error: mismatched input '{tok.text or '<EOF>'}' expecting IDENTIFIER")
        if tok.text in _RESERVED:
            self._fail(tok, f"reserved identifier: {tok.text}")
        return tok

    def _args(self, close: str) -> list[ast.Node]:
        args: list[ast.Node] = []
        if self._accept(close):
            return args
        while True:
            args.append(self._expr())
            if self._accept(close):
                return args
            self._expect(",")

    def _primary(self) -> ast.Node:
        tok = self._peek()
        if tok.kind in ("int", "hex", "float"):
            self.i += 1
            return self._number(tok, negative=False)
        if tok.kind == "string":
            self.i += 1
            return ast.Const(tok.pos, self._string(tok))
        if tok.kind == "ident":
            if tok.text in ("true", "false"):
                self.i += 1
                return ast.Const(tok.pos, tok.text == "true")
            if tok.text == "null":
                self.i += 1
                return ast.Const(tok.pos, None)
            message = self._message(leading_dot=False)
            if message is not None:
                return message
            name = self._ident()
            paren = self._peek()
            if paren.kind == "op" and paren.text == "(":
                self.i += 1
                return self._call(name.text, self._args(")"), None, paren.pos)
            return ast.Ident(name.pos, name.text)
        if tok.kind == "op":
            if tok.text == ".":  # leading dot: root-scoped identifier
                self.i += 1
                message = self._message(leading_dot=True)
                if message is not None:
                    return message
                name = self._ident()
                if self._accept("("):
                    return self._call(name.text, self._args(")"), None, name.pos)
                return ast.Ident(name.pos, name.text)
            if tok.text == "(":
                self.i += 1
                node = self._expr()
                self._expect(")")
                return node
            if tok.text in ("[", "[?"):  # `[?x, ...]`: the lexer took the first optional marker with the bracket
                self.i += 1
                return self._list(tok, first_optional=tok.text == "[?")
            if tok.text == "{":
                self.i += 1
                return self._map(tok)
        self._fail(tok, f"Syntax error: mismatched input '{tok.text or '<EOF>'}' expecting an expression")
        raise AssertionError("unreachable")

    def _message(self, leading_dot: bool) -> ast.Node | None:
        """`a.b.C{field: value, ?opt: value}` (the grammar's CreateMessage: dotted identifiers, then a brace), or
        None, consuming nothing, when the identifiers are not followed by a brace."""
        j = self.i
        while True:
            if self.tokens[j].kind != "ident":
                return None
            after = self.tokens[j + 1]
            if after.kind == "op" and after.text == "{":
                break
            if after.kind != "op" or after.text != ".":
                return None
            j += 2
        names = [self._ident().text]
        while self._accept("."):
            names.append(self._ident().text)
        brace = self._expect("{")
        fields: list[ast.Field] = []
        while not self._accept("}"):
            opt = self._accept("?")
            name = self._field()
            colon = self._expect(":")
            fields.append(ast.Field(colon.pos, name.text, self._expr(), opt))
            if not self._accept(","):
                self._expect("}")
                break
        return ast.Struct(brace.pos, "." * leading_dot + ".".join(names), tuple(fields))

    def _list(self, start: Token, first_optional: bool = False) -> ast.Node:
        elements: list[ast.Node] = []
        optional: list[bool] = []
        while first_optional or not self._accept("]"):
            optional.append(first_optional or self._accept("?"))
            first_optional = False
            elements.append(self._expr())
            if not self._accept(","):
                self._expect("]")
                break
        return ast.ListLit(start.pos, tuple(elements), tuple(optional))

    def _map(self, start: Token) -> ast.Node:
        entries: list[tuple[ast.Node, ast.Node, bool]] = []
        while not self._accept("}"):
            opt = self._accept("?")
            key = self._expr()
            self._expect(":")
            entries.append((key, self._expr(), opt))
            if not self._accept(","):
                self._expect("}")
                break
        return ast.MapLit(start.pos, tuple(entries))

    def _number(self, tok: Token, negative: bool) -> ast.Node:
        text = tok.text
        if tok.kind == "float":
            value = float(text)
            if math.isinf(value):  # Go's ParseFloat refuses what rounds beyond the largest double
                self._fail(tok, "invalid double literal")
            return ast.Const(tok.pos, -value if negative else value)
        unsigned = text.endswith(("u", "U"))
        digits = text.rstrip("uU")
        number = int(digits, 16) if tok.kind == "hex" else int(digits)
        if unsigned:
            if number > _UINT64_MAX:
                self._fail(tok, "invalid uint literal")
            return ast.Const(tok.pos, UInt(number))
        number = -number if negative else number
        if not -(2**63) <= number <= _INT64_MAX:
            self._fail(tok, "invalid int literal")
        return ast.Const(tok.pos, number)

    def _string(self, tok: Token) -> str | bytes:
        text = tok.text
        prefix_len = 0
        while text[prefix_len] not in "'\"":
            prefix_len += 1
        prefix = text[:prefix_len].lower()
        quote = 3 if text[prefix_len : prefix_len + 3] in ('"""', "'''") else 1
        body = text[prefix_len + quote : len(text) - quote]
        try:
            return _unescape(body, "r" in prefix, "b" in prefix)
        except (ValueError, IndexError) as err:
            self._fail(tok, "unable to unescape string")  # cel-go's wording, whatever the bad escape
            raise AssertionError("unreachable") from err

    # -- macros --------------------------------------------------------------------------------------------------
    def _var(self, node: ast.Node) -> str:
        if not isinstance(node, ast.Ident):
            self._fail(node.pos, "argument must be a simple name")
        assert isinstance(node, ast.Ident)
        return node.name

    def _call(self, name: str, args: list[ast.Node], target: ast.Node | None, pos: int) -> ast.Node:
        n = len(args)
        if target is None:
            if name == "has" and n == 1:
                if not isinstance(args[0], ast.Select) or args[0].optional:
                    self._fail(pos, "invalid argument to has() macro")
                assert isinstance(args[0], ast.Select)
                return ast.Has(pos, args[0])
            return ast.Call(pos, name, tuple(args))
        if name == "bind" and n == 3 and isinstance(target, ast.Ident) and target.name == "cel":
            return ast.Bind(pos, self._var(args[0]), args[1], args[2])
        # Kubernetes' environment has cel-go's standard macros (exists_one, not the camel-case existsOne alias)
        one_var = {"all": 2, "exists": 2, "exists_one": 2, "filter": 2, "map": 2, "sortBy": 2}
        if name in one_var and n == 2:
            return ast.Comprehension(pos, name, target, self._iteration_var(args[0], name), None, args[1])
        if name in ("optMap", "optFlatMap") and n == 2:
            return ast.Comprehension(pos, name, target, self._var(args[0]), None, args[1])
        if name == "map" and n == 3:
            return ast.Comprehension(pos, "map", target, self._iteration_var(args[0], name), None, args[1], args[2])
        if name in ("all", "exists", "exists_one", "existsOne") and n == 3:  # ext.TwoVarComprehensions: both spellings
            var, var2 = self._iteration_vars(args)
            macro = "exists_one" if name == "existsOne" else name
            return ast.Comprehension(pos, macro, target, var, var2, args[2])
        if name in ("transformList", "transformMap", "transformMapEntry") and n in (3, 4):
            var, var2 = self._iteration_vars(args)
            body, transform = (args[2], args[3]) if n == 4 else (ast.Const(pos, True), args[2])
            return ast.Comprehension(pos, name, target, var, var2, body, transform, filtered=n == 4)
        return ast.Call(pos, name, tuple(args), target)

    def _iteration_var(self, node: ast.Node, macro: str) -> str:
        """A comprehension's variable, which may not shadow its accumulator (cel-go's macro expanders; sortBy's
        variable is not a comprehension's)."""
        name = self._var(node)
        if name == ACCUMULATOR and macro != "sortBy":
            self._fail(node.pos, "iteration variable overwrites accumulator variable")
        return name

    def _iteration_vars(self, args: list[ast.Node]) -> tuple[str, str]:
        """The two variables of a two-variable comprehension: not each other, then neither the accumulator (the
        order of ext's extractIterVars)."""
        var, var2 = self._var(args[0]), self._var(args[1])
        if var == var2:
            self._fail(args[1].pos, f"duplicate variable name: {var}")
        for node, name in ((args[0], var), (args[1], var2)):
            if name == ACCUMULATOR:
                self._fail(node.pos, "iteration variable overwrites accumulator variable")
        return var, var2


_NESTING_OPS: Final = frozenset({"_?_:_", "_+_", "_-_", "_*_", "_/_", "_%_", *_RELATIONS.values()})


def _nests(node: ast.Node) -> bool:
    """What cel-go's visitor counts as a level: ternaries, relations, arithmetic, selections, member calls
    (macros included) and indexing; not `&&`/`||` (balanced), negation, literals or global calls."""
    if isinstance(node, ast.Call):
        return node.target is not None or node.function in _NESTING_OPS
    return isinstance(node, ast.Select | ast.Index | ast.Comprehension | ast.Bind)


def visitor_depth(tree: ast.Node) -> int:
    deepest = 0
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        depth += _nests(node)
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in ast.children(node))
    return deepest


def parse(source: str, escaped_fields: bool = True) -> ast.Node:
    """The tree of `source`; `escaped_fields=False` refuses backquoted field names, as Kubernetes 1.36 does."""
    return Parser(source, escaped_fields).parse()
