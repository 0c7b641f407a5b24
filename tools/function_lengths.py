#!/usr/bin/env python3
"""Lists C++/CUDA functions longer than a limit, longest first.

Usage: tools/function_lengths.py [LIMIT] [DIR ...]   (default: 80 core eval sweeps)

A text scan, not a parser: comments and string literals are blanked, then every brace block whose
head ends in a parameter list (and is not a control statement, lambda or class) counts as a
function, from the line of its opening brace to the line of its closing one. Lambdas count towards
the function they are in. Good enough to find the functions to split; confirm by reading them.
"""
import pathlib
import re
import sys

def strip(text):
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i); j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2); j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(')' + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == '\\' else 1
            out.append(c + re.sub(r'[^\n]', ' ', text[i + 1:j]) + c); i = j + 1
        else:
            out.append(c); i += 1
    return ''.join(out)

def functions(path):
    text = strip(path.read_text())
    lines = text.split('\n')
    depth, stack, res = 0, [], []
    for ln, line in enumerate(lines, 1):
        for col, ch in enumerate(line):
            if ch == '{':
                head = text_before(lines, ln, col)
                kind = 'func' if is_function_head(head) and not any(k == 'func' for k, _, _ in stack) else 'other'
                stack.append((kind, ln, head))
            elif ch == '}' and stack:
                kind, start, head = stack.pop()
                if kind == 'func':
                    res.append((start, ln, ln - start + 1, name_of(head)))
    return res

def text_before(lines, ln, col):
    s = lines[ln - 1][:col]
    k = ln - 2
    while k >= 0 and len(s) < 400 and not re.search(r'[;{}]\s*$', lines[k]) and not lines[k].lstrip().startswith('#'):
        s = lines[k] + ' ' + s; k -= 1
    return s

def is_function_head(head):
    h = head.strip()
    if re.search(r'\b(namespace|class|struct|enum|union|extern)\b[^()]*$', h):
        return False
    if re.search(r'(=|return|\bif|\bfor|\bwhile|\bswitch|\bcatch|\bdo|\belse|\btry)\s*$', h):
        return False
    h2 = re.sub(r'(const|noexcept|override|final|->\s*[\w:<>,\s&*]+|\s)*$', '', h)
    h2 = re.sub(r':\s*\w[\w:<>]*\s*[({].*$', '', h2) if ')' in h2 else h2  # ctor initializer list
    return h2.endswith(')') and not re.search(r'[=(,]\s*\[[^\]]*\]\s*\([^)]*\)\s*$', h2) and '](' not in h2.replace(' ', '')[-80:]

def name_of(head):
    m = re.findall(r'([~\w:]+)\s*\(', head)
    return m[0] if m else head.strip()[-40:]

def main():
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 80
    roots = sys.argv[2:] or ['core', 'eval', 'sweeps']
    rows = []
    for root in roots:
        paths = [pathlib.Path(root)] if pathlib.Path(root).is_file() else sorted(
            pathlib.Path(root).rglob('*'))
        for p in paths:
            if p.suffix in ('.cpp', '.hpp', '.cu', '.cuh', '.h') and p.is_file():
                for start, _, n, name in functions(p):
                    if n > limit:
                        rows.append((n, f'{p}:{start}', name))
    for n, where, name in sorted(rows, key=lambda r: -r[0]):
        print(f'{n:5d} {where} {name}')


if __name__ == '__main__':
    main()
