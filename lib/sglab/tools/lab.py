"""JupyterLab on the workbook: each notebook once, and a session that leaves ``git status`` clean.

``make lab``'s contents manager lists only the ``.ipynb`` of a ``NN_topic`` pair and saves a
workbook notebook as ``sglab sync`` writes it: both files, no outputs, execution counts or timing
stamps, the committed metadata. Other notebooks are saved unchanged."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class


WORKBOOK = re.compile(r"^\d\d_[A-Za-z0-9_]+\.(ipynb|py)$")
VIEW_STATE = ("execution", "scrolled", "collapsed")  # what running and looking add to a cell


def is_workbook(path: str) -> bool:
    return bool(WORKBOOK.match(PurePosixPath(path).name))


def strip_session(content: dict, committed_metadata: dict | None) -> dict:
    """``content`` (a notebook as JSON) without outputs, counts, timing and view state."""
    for cell in content.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        meta = cell.get("metadata", {})
        for key in VIEW_STATE:
            meta.pop(key, None)
    if committed_metadata is not None:
        content["metadata"] = committed_metadata
    else:
        for key in ("language_info", "widgets"):
            content.get("metadata", {}).pop(key, None)
    return content


class ContentsManager(build_async_jupytext_contents_manager_class(AsyncLargeFileManager)):
    """Jupytext's contents manager with the two workbook rules above."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if model.get("type") == "directory" and content and model.get("content") is not None:
            names = {item["name"] for item in model["content"]}
            model["content"] = [
                item for item in model["content"]
                if not (item["name"].endswith(".py") and is_workbook(item["name"])
                        and item["name"][:-3] + ".ipynb" in names)
            ]
        return model

    async def save(self, model, path=""):
        path = path.strip("/")
        if model.get("type") != "notebook" or model.get("content") is None or not is_workbook(path):
            return await super().save(model, path)
        import nbformat

        from sglab.tools.nbtools import py_source

        try:  # the notebook metadata as committed
            os_path = self._get_os_path(str(PurePosixPath(path).with_suffix(".ipynb")))
            committed = dict(nbformat.read(os_path, as_version=4).metadata)
        except (OSError, ValueError):
            committed = None
        model["content"] = strip_session(model["content"], committed)
        saved = await super().save(model, path)
        # the .py as committed (jupytext stamps its version into it on every save)
        py = str(PurePosixPath(path).with_suffix(".py"))
        text = py_source(nbformat.from_dict(model["content"]))
        current = await AsyncLargeFileManager.get(self, py, content=True, type="file",
                                                  format="text")
        if current["content"] != text:
            source = {"type": "file", "format": "text", "content": text}
            await AsyncLargeFileManager.save(self, source, py)
        saved["last_modified"] = (await self.get(path, content=False))["last_modified"]
        return saved
