#!/usr/bin/python3
"""Checks docs/architecture.md's folder table against the build (a CTest test runs this).

Every folder with a chorus_* library must have a row; the chorus folders named in its
"depends on" column must be exactly those its CMake target links (PUBLIC, PRIVATE or INTERFACE);
and each of them must come earlier in the table, which is what "folders depend downward only"
promises. A row may say "everything above" instead of listing them (the CLI).
    check_architecture.py [SOURCE_DIR]
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)

# chorus_* library -> folder, and each library's chorus_* links, from the folders' CMakeLists.
library_folder = {}
links = {}
for cmake in sorted(root.glob("*/CMakeLists.txt")):
    folder = cmake.parent.name
    text = re.sub(r"#[^\n]*", "", cmake.read_text())
    for lib in re.findall(r"(?:add_library|chorus_add_schema)\(\s*(chorus_\w+)", text):
        library_folder[lib] = folder
    for target, args in re.findall(r"target_link_libraries\(\s*(chorus_\w+)([^)]*)\)", text):
        links.setdefault(target, set()).update(re.findall(r"\bchorus_\w+", args))
folder_deps = {}
for lib, folder in library_folder.items():
    deps = {library_folder[d] for d in links.get(lib, ()) if d in library_folder}
    folder_deps.setdefault(folder, set()).update(deps - {folder})

doc = root / "docs" / "architecture.md"
rows = []  # (line number, folder, depends-on text)
for number, line in enumerate(doc.read_text().splitlines(), 1):
    m = re.match(r"\|\s*`([\w-]+)/`\s*\|([^|]*)\|([^|]*)\|([^|]*)\|\s*$", line)
    if m:
        rows.append((number, m.group(1), m.group(4).strip()))

problems = []
order = {folder: i for i, (_, folder, _) in enumerate(rows)}
for folder in sorted(folder_deps):
    if folder not in order:
        problems.append(f"{doc}: no row for `{folder}/` (library "
                        f"{', '.join(l for l, f in library_folder.items() if f == folder)})")
for number, folder, depends in rows:
    if folder not in folder_deps:
        continue  # tests/, bench/: no library
    built = folder_deps[folder]
    for dep in sorted(built):
        if dep in order and order[dep] > order[folder]:
            problems.append(f"{doc}:{number}: `{folder}/` depends on `{dep}/`, which comes "
                            f"below it: folders depend downward only")
    if depends.startswith("everything above"):
        continue
    listed = re.sub(r"\([^)]*\)", "", depends)  # remarks in parentheses are prose
    named = {word for word in re.findall(r"[\w-]+", listed) if word in folder_deps}
    for dep in sorted(built - named):
        problems.append(f"{doc}:{number}: `{folder}/` links chorus_{dep} "
                        f"(its CMakeLists.txt) but its row does not name `{dep}`")
    for dep in sorted(named - built):
        problems.append(f"{doc}:{number}: `{folder}/`'s row names `{dep}`, which its "
                        f"CMakeLists.txt does not link")
if problems:
    print("\n".join(problems))
    print("fix docs/architecture.md's folder table (or the CMake links) so they agree")
    sys.exit(1)
print(f"architecture: {len(rows)} rows agree with the build ({len(folder_deps)} libraries)")
