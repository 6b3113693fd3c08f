"""Trees of small stub files for the listing and scale studies (stdlib only: no numpy, no PIL)."""

from __future__ import annotations

import os


def make_tree(root: str, files: int, labels: int, per_dir: int, file_bytes: int = 16) -> None:
    """Create ``files`` small files: ``root/label_XX/dir_XXXX/XXXXXXX.jpg``."""
    made: set[str] = set()
    for i in range(files):
        label, leaf = i % labels, i // (labels * per_dir)
        directory = os.path.join(root, f"label_{label:02d}", f"dir_{leaf:05d}")
        if directory not in made:
            os.makedirs(directory, exist_ok=True)
            made.add(directory)
            stub = os.path.join(directory, ".stub.jpg")  # hidden: the listing skips it
            with open(stub, "wb") as f:
                f.write(b"\xff\xd8\xff" + b"\0" * max(0, file_bytes - 3))
        os.link(stub, os.path.join(directory, f"{i:07d}.jpg"))


def plain_walk(root: str) -> list[tuple[str, int, int]]:
    """The bound: every file's path, size and mtime by ``os.scandir`` + ``stat``, sorted."""
    out = []
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.is_dir():
                    stack.append(entry.path)
                elif not entry.name.startswith("."):
                    st = entry.stat()
                    out.append((entry.path, st.st_size, st.st_mtime_ns))
    out.sort()
    return out
