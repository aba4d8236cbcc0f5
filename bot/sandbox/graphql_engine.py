"""A small GraphQL engine: enough of the language for the queries clients send GitHub.

It parses a document (operations with variables, aliases, arguments of every literal
kind, inline fragments, named fragments, `@include`/`@skip`, comments), validates it
against a schema the way GitHub does before running anything (unknown fields, unknown or
missing arguments, selections on scalars, fragments on the wrong type, undeclared or
missing variables), and executes it with the schema's resolvers, answering only the
fields that were asked for, under their aliases. Errors have GitHub's shape; a field that
fails is null, and a non-null one makes its parent null, as the specification says.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# --- errors ----------------------------------------------------------------------------


@dataclass(eq=False)
class GraphQLError(Exception):
    message: str
    line: int = 0
    column: int = 0
    path: list[str | int] | None = None
    type: str | None = None  # GitHub's error type: NOT_FOUND, FORBIDDEN, …
    extensions: dict[str, Any] | None = None

    def document(self) -> dict[str, Any]:
        shaped: dict[str, Any] = {}
        if self.type is not None:
            shaped["type"] = self.type
        if self.path is not None:
            shaped["path"] = self.path
        if self.extensions is not None:
            shaped["extensions"] = self.extensions
        if self.line:
            shaped["locations"] = [{"line": self.line, "column": self.column}]
        shaped["message"] = self.message
        return shaped


class _NullBubble(Exception):
    """A non-null field came out null: its parent must be null instead."""


# --- lexing ----------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<skip>[\s,\ufeff]+|\#[^\n\r]*)
  | (?P<block>\"\"\"(?:\\\"\"\"|(?!\"\"\").)*\"\"\")
  | (?P<string>"(?:[^"\\\n\r]|\\.)*")
  | (?P<number>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
  | (?P<name>[_A-Za-z][_0-9A-Za-z]*)
  | (?P<punct>\.\.\.|[!$&()\:=@\[\]{|}])
""", re.VERBOSE | re.DOTALL)


@dataclass(frozen=True)
class Token:
    kind: str  # name, string, number, punct, end
    value: str
    line: int
    column: int


def tokenize(source: str) -> list[Token]:
    line_starts = [0] + [m.end() for m in re.finditer(r"\r\n|\n|\r", source)]

    def position(offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(line_starts, offset)
        return line, offset - line_starts[line - 1] + 1

    tokens: list[Token] = []
    offset = 0
    while offset < len(source):
        found = _TOKEN.match(source, offset)
        if found is None:
            line, column = position(offset)
            raise GraphQLError(f'Parse error on "{source[offset]}" at [{line}, {column}]',
                               line, column)
        kind = found.lastgroup or "skip"
        if kind != "skip":
            tokens.append(Token(kind, found.group(), *position(offset)))
        offset = found.end()
    tokens.append(Token("end", "", *position(len(source))))
    return tokens


def string_value(token: Token) -> str:
    if token.kind == "block":
        return token.value[3:-3].replace('\\"""', '"""').strip("\n")
    decoded: str = json.loads(token.value)  # GraphQL's escapes are JSON's
    return decoded


# --- the document ----------------------------------------------------------------------


@dataclass(frozen=True)
class Variable:
    name: str


@dataclass(frozen=True)
class EnumValue:
    name: str


@dataclass
class Directive:
    name: str
    args: dict[str, Any]


@dataclass
class Field:
    name: str
    alias: str | None
    args: dict[str, Any]
    directives: list[Directive]
    selections: list[Selection]
    line: int
    column: int

    @property
    def key(self) -> str:
        return self.alias or self.name


@dataclass
class InlineFragment:
    on: str | None
    directives: list[Directive]
    selections: list[Selection]
    line: int
    column: int


@dataclass
class FragmentSpread:
    name: str
    directives: list[Directive]
    line: int
    column: int


Selection = Field | InlineFragment | FragmentSpread


@dataclass
class VariableDefinition:
    name: str
    type: str  # as written, e.g. "String!" or "[Int]"
    default: Any = None
    has_default: bool = False

    @property
    def required(self) -> bool:
        return self.type.endswith("!") and not self.has_default


@dataclass
class Operation:
    kind: str  # query, mutation, subscription
    name: str | None
    variables: list[VariableDefinition]
    selections: list[Selection]


@dataclass
class Fragment:
    name: str
    on: str
    selections: list[Selection]
    line: int
    column: int


@dataclass
class Document:
    operations: list[Operation] = field(default_factory=list)
    fragments: dict[str, Fragment] = field(default_factory=dict)


class Parser:
    def __init__(self, source: str) -> None:
        self.tokens = tokenize(source)
        self.index = 0

    # --- token handling ---

    @property
    def token(self) -> Token:
        return self.tokens[self.index]

    def peek(self, value: str) -> bool:
        return self.token.kind in ("punct", "name") and self.token.value == value

    def advance(self) -> Token:
        token = self.token
        self.index += 1
        return token

    def expect(self, value: str) -> Token:
        if not self.peek(value):
            raise self.unexpected()
        return self.advance()

    def name(self) -> str:
        if self.token.kind != "name":
            raise self.unexpected()
        return self.advance().value

    def unexpected(self) -> GraphQLError:
        token = self.token
        shown = token.value if token.kind != "end" else "end of file"
        return GraphQLError(f'Parse error on "{shown}" at [{token.line}, {token.column}]',
                            token.line, token.column)

    # --- grammar ---

    def document(self) -> Document:
        parsed = Document()
        while self.token.kind != "end":
            if self.peek("fragment"):
                fragment = self.fragment()
                parsed.fragments[fragment.name] = fragment
            else:
                parsed.operations.append(self.operation())
        if not parsed.operations:
            raise GraphQLError("The document holds no operation to run")
        return parsed

    def operation(self) -> Operation:
        if self.peek("{"):
            return Operation("query", None, [], self.selection_set())
        kind = self.name()
        if kind not in ("query", "mutation", "subscription"):
            self.index -= 1
            raise self.unexpected()
        name = self.name() if self.token.kind == "name" else None
        variables = self.variable_definitions() if self.peek("(") else []
        self.directives()
        return Operation(kind, name, variables, self.selection_set())

    def variable_definitions(self) -> list[VariableDefinition]:
        self.expect("(")
        found = []
        while not self.peek(")"):
            self.expect("$")
            definition = VariableDefinition(self.name(), "")
            self.expect(":")
            definition.type = self.type_reference()
            if self.peek("="):
                self.advance()
                definition.default, definition.has_default = self.value(constant=True), True
            self.directives()
            found.append(definition)
        self.advance()
        return found

    def type_reference(self) -> str:
        if self.peek("["):
            self.advance()
            inner = self.type_reference()
            self.expect("]")
            written = f"[{inner}]"
        else:
            written = self.name()
        if self.peek("!"):
            self.advance()
            written += "!"
        return written

    def fragment(self) -> Fragment:
        start = self.expect("fragment")
        name = self.name()
        self.expect("on")
        on = self.name()
        self.directives()
        return Fragment(name, on, self.selection_set(), start.line, start.column)

    def selection_set(self) -> list[Selection]:
        self.expect("{")
        selections = []
        while not self.peek("}"):
            selections.append(self.selection())
        self.advance()
        if not selections:
            raise self.unexpected()
        return selections

    def selection(self) -> Selection:
        if self.peek("..."):
            return self.fragment_selection()
        start = self.token
        name = self.name()
        alias = None
        if self.peek(":"):
            self.advance()
            alias, name = name, self.name()
        args = self.arguments() if self.peek("(") else {}
        directives = self.directives()
        selections = self.selection_set() if self.peek("{") else []
        return Field(name, alias, args, directives, selections, start.line, start.column)

    def fragment_selection(self) -> Selection:
        start = self.expect("...")
        if self.token.kind == "name" and not self.peek("on"):
            return FragmentSpread(self.name(), self.directives(), start.line, start.column)
        on = None
        if self.peek("on"):
            self.advance()
            on = self.name()
        directives = self.directives()
        return InlineFragment(on, directives, self.selection_set(), start.line, start.column)

    def directives(self) -> list[Directive]:
        found = []
        while self.peek("@"):
            self.advance()
            name = self.name()
            found.append(Directive(name, self.arguments() if self.peek("(") else {}))
        return found

    def arguments(self) -> dict[str, Any]:
        self.expect("(")
        args: dict[str, Any] = {}
        while not self.peek(")"):
            name = self.name()
            self.expect(":")
            args[name] = self.value()
        self.advance()
        return args

    def value(self, constant: bool = False) -> Any:
        token = self.token
        if token.kind == "punct" and token.value == "$" and not constant:
            self.advance()
            return Variable(self.name())
        if token.kind in ("string", "block"):
            return string_value(self.advance())
        if token.kind == "number":
            text = self.advance().value
            return float(text) if any(c in text for c in ".eE") else int(text)
        if token.kind == "name":
            word = self.advance().value
            return {"true": True, "false": False, "null": None}.get(word, EnumValue(word))
        if self.peek("["):
            return self.list_value(constant)
        if self.peek("{"):
            return self.object_value(constant)
        raise self.unexpected()

    def list_value(self, constant: bool) -> list[Any]:
        self.expect("[")
        items = []
        while not self.peek("]"):
            items.append(self.value(constant))
        self.advance()
        return items

    def object_value(self, constant: bool) -> dict[str, Any]:
        self.expect("{")
        fields: dict[str, Any] = {}
        while not self.peek("}"):
            name = self.name()
            self.expect(":")
            fields[name] = self.value(constant)
        self.advance()
        return fields


def parse(source: str) -> Document:
    return Parser(source).document()


# --- the schema ------------------------------------------------------------------------

Resolver = Callable[[Any, Any, dict[str, Any]], Any]


@dataclass(frozen=True)
class FieldDef:
    type: str  # a type of the schema or a scalar
    resolve: Resolver  # (context, parent value, arguments) -> value
    args: dict[str, bool] = field(default_factory=dict)  # argument -> required
    non_null: bool = False
    is_list: bool = False


@dataclass(frozen=True)
class Schema:
    types: dict[str, dict[str, FieldDef]]  # object and interface types
    interfaces: dict[str, frozenset[str]]  # interface -> the object types implementing it
    scalars: frozenset[str]
    type_of: Callable[[Any], str]  # the object type of a resolved value

    def overlaps(self, condition: str, parent: str) -> bool:
        """Whether a fragment on `condition` can apply inside a selection on `parent`."""
        def members(name: str) -> frozenset[str]:
            return self.interfaces.get(name, frozenset({name}))
        return bool(members(condition) & members(parent))


# --- validation ------------------------------------------------------------------------


@dataclass
class Validator:
    schema: Schema
    document: Document
    errors: list[GraphQLError] = field(default_factory=list)

    def run(self, operation: Operation, variables: dict[str, Any]) -> list[GraphQLError]:
        self.selections(operation.selections, "Query", [operation.kind], set())
        self.variables(operation, variables)
        return self.errors

    def fail(self, node: Field | InlineFragment | FragmentSpread | Fragment, path: list[str],
             message: str, **extensions: str) -> None:
        self.errors.append(GraphQLError(message, node.line, node.column, list(path),
                                        extensions=extensions or None))

    def selections(self, selections: list[Selection], parent: str, path: list[str],
                   spread: set[str]) -> None:
        for selection in selections:
            if isinstance(selection, Field):
                self.field(selection, parent, path, spread)
            elif isinstance(selection, InlineFragment):
                self.inline(selection, parent, path, spread)
            else:
                self.spread(selection, parent, path, spread)

    def field(self, node: Field, parent: str, path: list[str], spread: set[str]) -> None:
        here = [*path, node.key]
        if node.name == "__typename":
            return
        definition = self.schema.types[parent].get(node.name)
        if definition is None:
            self.fail(node, here, f"Field '{node.name}' doesn't exist on type '{parent}'",
                      code="undefinedField", typeName=parent, fieldName=node.name)
            return
        for name in node.args:
            if name not in definition.args:
                self.fail(node, here, f"Field '{node.name}' doesn't accept argument '{name}'",
                          code="argumentNotAccepted", name=node.name, argumentName=name)
        missing = [a for a, required in definition.args.items() if required and a not in node.args]
        if missing:
            self.fail(node, here, f"Field '{node.name}' is missing required arguments: "
                      f"{', '.join(missing)}", code="missingRequiredArguments")
        self.field_selections(node, definition, here, spread)

    def field_selections(self, node: Field, definition: FieldDef, path: list[str],
                         spread: set[str]) -> None:
        scalar = definition.type in self.schema.scalars
        if scalar and node.selections:
            self.fail(node, path, f"Selections can't be made on scalars (field '{node.name}' "
                      f"returns {definition.type} but has selections)",
                      code="selectionMismatch")
        elif not scalar and not node.selections:
            self.fail(node, path, f"Field must have selections (field '{node.name}' returns "
                      f"{definition.type} but has no selections)", code="selectionMismatch")
        elif not scalar:
            self.selections(node.selections, definition.type, path, spread)

    def inline(self, node: InlineFragment, parent: str, path: list[str],
               spread: set[str]) -> None:
        on = node.on or parent
        if self.condition_fits(node, on, parent, path):
            self.selections(node.selections, on, [*path, f"... on {on}"], spread)

    def spread(self, node: FragmentSpread, parent: str, path: list[str],
               spread: set[str]) -> None:
        fragment = self.document.fragments.get(node.name)
        if fragment is None:
            self.fail(node, path, f"Fragment {node.name} was used, but not defined",
                      code="useAndDefineFragment")
        elif node.name in spread:
            self.fail(node, path, f"Fragment {node.name} contains an infinite loop",
                      code="infiniteLoop")
        elif self.condition_fits(node, fragment.on, parent, path):
            self.selections(fragment.selections, fragment.on, [*path, f"... {node.name}"],
                            spread | {node.name})

    def condition_fits(self, node: InlineFragment | FragmentSpread, on: str, parent: str,
                       path: list[str]) -> bool:
        if on not in self.schema.types:
            self.fail(node, path, f"No such type {on}, so it can't be a fragment condition",
                      code="undefinedType", typeName=on)
            return False
        if not self.schema.overlaps(on, parent):
            self.fail(node, path, f"Fragment on {on} can't be spread inside {parent}",
                      code="fragmentSpreadImpossible")
            return False
        return True

    def variables(self, operation: Operation, given: dict[str, Any]) -> None:
        declared = {v.name for v in operation.variables}
        for name in sorted(used_variables(operation, self.document) - declared):
            self.errors.append(GraphQLError(
                f"Variable ${name} is used by {operation.name or 'anonymous query'} but not "
                "declared", extensions={"code": "variableNotDefined", "variableName": name}))
        for definition in operation.variables:
            if definition.required and given.get(definition.name) is None:
                self.errors.append(GraphQLError(
                    f"Variable ${definition.name} of type {definition.type} was provided "
                    "invalid value", extensions={"code": "variableMismatch"}))


def used_variables(operation: Operation, document: Document) -> set[str]:
    def values(value: Any) -> Iterator[str]:
        if isinstance(value, Variable):
            yield value.name
        elif isinstance(value, list):
            for item in value:
                yield from values(item)
        elif isinstance(value, dict):
            for item in value.values():
                yield from values(item)

    def walk(selections: list[Selection], seen: set[str]) -> Iterator[str]:
        for selection in selections:
            for directive in selection.directives:
                yield from values(directive.args)
            if isinstance(selection, Field):
                yield from values(selection.args)
                yield from walk(selection.selections, seen)
            elif isinstance(selection, InlineFragment):
                yield from walk(selection.selections, seen)
            elif selection.name in document.fragments and selection.name not in seen:
                fragment = document.fragments[selection.name]
                yield from walk(fragment.selections, seen | {selection.name})

    return set(walk(operation.selections, set()))


# --- execution -------------------------------------------------------------------------


@dataclass
class Execution:
    schema: Schema
    document: Document
    variables: dict[str, Any]
    context: Any
    errors: list[GraphQLError] = field(default_factory=list)

    def selections(self, selections: list[Selection], value: Any,
                   path: list[str | int]) -> dict[str, Any]:
        runtime = self.schema.type_of(value)
        result: dict[str, Any] = {}
        for key, nodes in self.collect(selections, runtime).items():
            node = nodes[0]
            if node.name == "__typename":
                result[key] = runtime
                continue
            definition = self.schema.types[runtime][node.name]
            result[key] = self.field(definition, nodes, value, [*path, key])
        return result

    def field(self, definition: FieldDef, nodes: list[Field], parent: Any,
              path: list[str | int]) -> Any:
        node = nodes[0]
        try:
            value = definition.resolve(self.context, parent, self.arguments(node.args))
        except GraphQLError as error:
            error.line, error.column, error.path = node.line, node.column, path
            self.errors.append(error)
            value = None
        if value is None:
            if definition.non_null:
                raise _NullBubble
            return None
        if definition.type in self.schema.scalars:
            return value
        inner = [s for n in nodes for s in n.selections]
        try:
            if definition.is_list:
                return [self.selections(inner, item, [*path, index])
                        for index, item in enumerate(value)]
            return self.selections(inner, value, path)
        except _NullBubble:
            if definition.non_null:
                raise
            return None

    def collect(self, selections: list[Selection], runtime: str,
                into: dict[str, list[Field]] | None = None) -> dict[str, list[Field]]:
        """The fields to answer for an object of type `runtime`, by response key."""
        fields = into if into is not None else {}
        for selection in selections:
            if not self.included(selection.directives):
                continue
            if isinstance(selection, Field):
                fields.setdefault(selection.key, []).append(selection)
                continue
            if isinstance(selection, InlineFragment):
                on, inner = selection.on, selection.selections
            else:
                fragment = self.document.fragments[selection.name]
                on, inner = fragment.on, fragment.selections
            if on is None or self.schema.overlaps(on, runtime):
                self.collect(inner, runtime, fields)
        return fields

    def included(self, directives: list[Directive]) -> bool:
        for directive in directives:
            condition = self.arguments(directive.args).get("if")
            if directive.name == "skip" and condition is True:
                return False
            if directive.name == "include" and condition is False:
                return False
        return True

    def arguments(self, args: dict[str, Any]) -> dict[str, Any]:
        return {name: self.value(value) for name, value in args.items()}

    def value(self, value: Any) -> Any:
        if isinstance(value, Variable):
            return self.variables.get(value.name)
        if isinstance(value, EnumValue):
            return value.name
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, dict):
            return {name: self.value(item) for name, item in value.items()}
        return value


def pick_operation(document: Document, name: str | None) -> Operation:
    if name is None:
        if len(document.operations) > 1:
            raise GraphQLError("An operation name is required")
        return document.operations[0]
    for operation in document.operations:
        if operation.name == name:
            return operation
    raise GraphQLError(f'No operation named "{name}"')


def run(schema: Schema, root: Any, source: str, variables: dict[str, Any],
        operation_name: str | None, context: Any) -> dict[str, Any]:
    """The answer to one GraphQL request: {"data": …} and/or {"errors": […]}."""
    try:
        document = parse(source)
        operation = pick_operation(document, operation_name)
    except GraphQLError as error:
        return {"errors": [error.document()]}
    if operation.kind != "query":
        return {"errors": [GraphQLError(f"The sandbox answers queries, not {operation.kind}s")
                           .document()]}
    invalid = Validator(schema, document).run(operation, variables)
    if invalid:
        return {"errors": [error.document() for error in invalid]}
    given = {v.name: v.default for v in operation.variables if v.has_default} | variables
    execution = Execution(schema, document, given, context)
    try:
        data: dict[str, Any] | None = execution.selections(operation.selections, root, [])
    except _NullBubble:
        data = None
    answer: dict[str, Any] = {"data": data}
    if execution.errors:
        answer["errors"] = [error.document() for error in execution.errors]
    return answer
