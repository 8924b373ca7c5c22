"""The pages a user reads and the presets' provenance cite only what ships with them: no
project-internal documents ("the reference doc", nvfp4-kv-reference.md, ../shared) and no
issue numbers of this project's tracker. An engine's own files, functions, versions and its
own tracker (vLLM #50084) are fine.
usage: check_citations.py ROOT"""
import pathlib
import re
import sys

PATTERNS = [
    (re.compile(r"reference doc", re.I), "a document outside the repository"),
    (re.compile(r"nvfp4-kv-reference"), "a document outside the repository"),
    (re.compile(r"\.\./shared"), "a path outside the repository"),
    (re.compile(r"(?<![\w#])issues? \d+", re.I), "this project's issue tracker"),
]


def main(root):
    root = pathlib.Path(root)
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "layouts").glob("*.json")),
             *sorted((root / "python" / "nvfp4kv").glob("*.py"))]
    problems = []
    for page in pages:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for pattern, what in PATTERNS:
                m = pattern.search(line)
                if m:
                    problems.append("%s:%d cites %s: %r" % (page.relative_to(root), n, what, m.group(0)))
    for p in problems:
        print(p)
    print("%d files, %d citations of things outside the repository" % (len(pages), len(problems)))
    return 1 if problems or len(pages) < 10 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
