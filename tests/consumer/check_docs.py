"""docs/api.md's code blocks are the compiled examples of tests/consumer.

Every ```cpp block of the page must equal a region of an example program
between two "// [name]" lines (compared after removing the common indent), and
every such region must be shown on the page, so the page cannot drift from code
that CI compiles and the GPU machine runs.
usage: check_docs.py DOCS_MD EXAMPLE.cpp...
"""
import re
import sys
import textwrap


def blocks(markdown):
    return [textwrap.dedent(b).strip("\n") for b in re.findall(r"```cpp\n(.*?)```", markdown, re.S)]


def regions(source):
    found = {}
    for m in re.finditer(r"^[ \t]*// \[(\w+)\]\n(.*?)^[ \t]*// \[\1\]\n", source, re.S | re.M):
        found[m.group(1)] = textwrap.dedent(m.group(2)).strip("\n")
    return found


def main(argv):
    docs = open(argv[1]).read()
    shown = blocks(docs)
    marked = {}
    for path in argv[2:]:
        for name, text in regions(open(path).read()).items():
            marked["%s:%s" % (path.rsplit("/", 1)[-1], name)] = text
    problems = []
    for i, b in enumerate(shown):
        if b not in marked.values():
            first = b.splitlines()[0] if b else ""
            problems.append("block %d of %s (starting %r) is not a marked region of any example" % (i + 1, argv[1], first))
    for name, text in marked.items():
        if text not in shown:
            problems.append("example region %s is not shown in %s" % (name, argv[1]))
    for p in problems:
        print(p)
    print("%d code blocks, %d example regions: %s" % (len(shown), len(marked), "FAILED" if problems else "equal"))
    return 1 if problems or not shown else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
