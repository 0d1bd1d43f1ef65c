"""A model behind the runner interface: in process, or in a child runner process for crash isolation.

llama.cpp aborts the whole process on some failures (its RPC client calls
``GGML_ABORT`` when a remote server is lost mid-request); no Python ``try``
catches that. A model run isolated lives in a child process (as Ollama runs
every model in a runner subprocess), so an abort kills only that child: its
requests fail with :class:`~ollapy.errors.RunnerError` and the next request
reloads the model.

* :mod:`.process`: :class:`~.process.ProcessModel`, the parent's
  :class:`~ollapy.engine.interface.ModelRunner` (as :class:`ollapy.engine.model.LoadedModel` is in process;
  never imports llama_cpp).
* :mod:`.handles`: the parent's handles on the child's objects (a pending call, a generation's Request).
* :mod:`.childlog`: the child's output, logged again in the parent, its last line kept for errors.
* :mod:`.launch`: how the child is started (an isolated interpreter, a neutral working directory).
* :mod:`.child`: the child's side; it builds its model with :func:`ollapy.runner.loader.open_local`.
* :mod:`.loader`: the one place that turns a model name into a loaded model with its prompt cache
  (:func:`~.loader.open_model` for every caller, :func:`~.loader.open_local` in process).
* :mod:`.wire`: what crosses the socket besides engine objects: errors, model
  facts, embedding results.

:func:`ollapy.runner.loader.open_model` picks the runner: isolated when
``OLLAPY_RUNNER=process`` or the ``rpc`` option is set.
"""
