"""What can be wrong with one listed file, as the error its reject or failure names.

Shared by every record source (:mod:`tfshards.writing.sources`,
:mod:`tfshards.writing.features`): the same problem reads the same whichever
way the file was read.
"""

from __future__ import annotations

import hashlib

from tfshards.errors import CHANGED_SINCE_LISTING, ChangedSinceListingError, InputError
from tfshards.format.imageformat import NotAnImage
from tfshards.format.recordbuffer import ContentChanged, FileChanged
from tfshards.listing.contenthash import expected_md5
from tfshards.listing.hashcache import stale_listing

# A file larger than this is refused before it is read: a worker holds one
# whole file while framing it, and TensorFlow cannot parse an Example of 2 GiB
# or more (protobuf's message limit), so such a record could never be read.
MAX_FILE_BYTES = 1 << 30


def too_large(rel: str, size: int) -> InputError:
    return InputError(
        f"file too large: expected at most {MAX_FILE_BYTES} bytes, found {size}", path=rel
    )


def file_problem(
    problem: OSError | FileChanged | ContentChanged | NotAnImage,
    rel: str,
    listed_size: int,
    local_path: str | None = None,
) -> OSError | InputError:
    """What the framing reported about one file, as the error its reject or failure names."""
    if isinstance(problem, FileChanged):
        return size_error(rel, listed_size, problem.found)
    if isinstance(problem, ContentChanged):
        return content_error(rel, problem.expected, problem.found.hex(), local_path)
    if isinstance(problem, NotAnImage):
        return InputError(problem.problem(listed_size), path=rel)
    return problem


def check_md5(data: bytes, token: str, rel: str) -> None:
    """Compare fetched bytes with an MD5 the storage listed (S3 single-part ETag, GCS md5)."""
    want = expected_md5(token)
    if want is not None:
        found = hashlib.md5(data, usedforsecurity=False).hexdigest()
        if found != want:
            raise ChangedSinceListingError(
                f"{CHANGED_SINCE_LISTING}: expected md5 {want}, found {found}",
                path=rel,
            )


def size_error(rel: str, listed: int, found: int) -> InputError:
    if found == 0:  # listed empty: its content is the problem; else it was emptied since
        kind = InputError if listed == 0 else ChangedSinceListingError
        return kind("empty file: expected at least 1 byte, found 0", path=rel)
    return ChangedSinceListingError(
        f"{CHANGED_SINCE_LISTING}: expected {listed} bytes, found {found}", path=rel
    )


def content_error(rel: str, listed: bytes, found: str, local_path: str | None) -> InputError:
    """The file's bytes do not have the listed SHA-256: it changed, or the listing is wrong."""
    stale = stale_listing(rel, local_path, listed, found) if local_path is not None else None
    return stale or ChangedSinceListingError(
        f"{CHANGED_SINCE_LISTING}: expected sha256 {listed.hex()}, found {found}",
        path=rel,
    )
