"""JupyterLab settings of the workbook, loaded by `make lab`
(`jupyter lab --config=jupyter_server_config.py`).

- Each notebook once: the file browser lists NN_topic.ipynb and hides its paired NN_topic.py (the
  same notebook).
- A lab session leaves `git status` clean: saving a workbook notebook writes both files as `sglab
  sync` would, without outputs (see sglab.tools.lab). Outputs live in the browser; `sglab run` keeps
  them in reports/.
- Local only: bound to 127.0.0.1, with token authentication (the URL with the token is printed at
  start).
"""

c = get_config()  # noqa: F821 - provided by Jupyter when it loads this file
c.ServerApp.contents_manager_class = "sglab.tools.lab.ContentsManager"
c.ServerApp.ip = "127.0.0.1"
# kernels on local socket files, not TCP ports (no unencrypted-TCP warning)
c.KernelManager.transport = "ipc"
