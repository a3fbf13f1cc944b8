"""c_text.py: C source text with its comments blanked, for the layering
checks (check_layering.py, check_grid.py). Newlines are kept, so line
numbers hold."""
import re

# what can start a literal or a comment; the text between two is copied whole
SPECIAL = re.compile(r'["\'/]')


def blank_comments(text, blank_strings=False):
    """text with // and /* */ comments removed (a block comment leaves its
    newlines); string and character literals kept as they are, or with
    blank_strings their contents replaced by spaces (the quotes kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c in '"\'':
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            out.append(c + ' ' * max(0, j - i - 1) + c if blank_strings else text[i:j + 1])
            i = j + 1
        elif text.startswith('//', i):
            j = text.find('\n', i)
            i = n if j < 0 else j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append('\n' * text.count('\n', i, j))
            i = j
        else:
            m = SPECIAL.search(text, i + 1)
            j = m.start() if m else n
            out.append(text[i:j])
            i = j
    return ''.join(out)
