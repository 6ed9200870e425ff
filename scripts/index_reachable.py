"""Whether a package index serves torch here, asked within a few seconds (the Makefile's torch
stage): ``python scripts/index_reachable.py URL`` exits 0 when ``URL/torch/`` answers, else prints
why in a few words and exits 1; a bad call exits 2."""

import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request


TIMEOUT = 5.0  # seconds: an index that does not answer by then is not waited for


def why_not(url: str, timeout: float = TIMEOUT) -> str | None:
    """None when the index at ``url`` has a page for torch, else the reason in a few words."""
    page = url.rstrip("/") + "/torch/"
    if page.startswith("file:"):  # a folder of pages, as pip reads it
        folder = urllib.request.url2pathname(urllib.parse.urlparse(page).path)
        return None if os.path.exists(folder) else f"no folder {folder}"
    # pip's own certificate bundle where it is set in the environment, else the system's
    cafile = os.environ.get("PIP_CERT") or os.environ.get("REQUESTS_CA_BUNDLE") or None
    try:
        context = ssl.create_default_context(cafile=cafile)
        with urllib.request.urlopen(page, timeout=timeout, context=context):
            return None
    except urllib.error.HTTPError as e:
        return f"{page} answered HTTP {e.code}"
    except urllib.error.URLError as e:
        return f"{getattr(e.reason, 'strerror', None) or e.reason}"
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].startswith(("http://", "https://", "file:")):
        print("usage: index_reachable.py URL (an http(s) or file: address of a package index)",
              file=sys.stderr)
        return 2
    why = why_not(argv[0])
    if why is None:
        return 0
    print(why)
    return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
