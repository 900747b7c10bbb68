"""Fenced blocks of the book's markdown, for the tests that read its prose and its code.

A fence is 3 or more ` or ~ (its indent, character and length close it). Its body is code,
unless its info string names a directive that holds prose (`{admonition}`, `{dropdown}`,
...), which the page shows as text and wraps to the column."""
import re

FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,})(.*?)\n(.*?)^\1\2[ \t]*$", re.S | re.M)
#: Directives whose body is code.
CODE_DIRECTIVES = ("{code-block}", "{code}", "{code-cell}", "{literalinclude}")
#: A directive's option line at the top of its body, such as ":class: tip".
OPTION = re.compile(r"^[ \t]*:[\w-]+:.*$", re.M)


def _is_code(info: str) -> bool:
    info = info.strip()
    return not info.startswith("{") or info.startswith(CODE_DIRECTIVES)


def fenced_code(text: str):
    """The lines of `text`'s fenced code blocks, also those inside a prose directive."""
    for m in FENCE.finditer(text):
        if _is_code(m.group(3)):
            yield from m.group(4).splitlines()
        else:
            yield from fenced_code(m.group(4))


def without_code(text: str) -> str:
    """`text` with its fenced code blocks removed; a prose directive keeps its title and its
    body (less its option lines), since the reader reads them."""
    def keep(m):
        if _is_code(m.group(3)):
            return " "
        title = m.group(3).strip().split(maxsplit=1)[1:]
        return " ".join([" ", *title, OPTION.sub(" ", without_code(m.group(4))), " "])
    return FENCE.sub(keep, text)
