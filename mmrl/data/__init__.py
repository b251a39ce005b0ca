"""Dataset readers and deterministic synthetic generators (public: plugins may import them).

- :mod:`~mmrl.data.records`: :class:`~mmrl.data.records.FileExamples`, the lazy reader of real
  data every task uses (bad records skipped and counted), ``BadRecord``, ``require_image``;
- :mod:`~mmrl.data.sources`: JSONL, JSON, parquet and ``datasets`` directories as raw records
  (:mod:`~mmrl.data.json_files`: JSON arrays, CLEVR's and GQA's objects, each record named by its
  entry; :mod:`~mmrl.data.messages`: skip reasons and errors of bounded length);
- :mod:`~mmrl.data.fields`: the ``task.options.fields`` mapping and the common layouts
  (VLM-R1 ``conversations``, verl / EasyR1 columns);
- :mod:`~mmrl.data.images`: image references (paths, bytes, lists), folders of image files;
- :mod:`~mmrl.data.screenspot`: ScreenSpot / ScreenSpot-v2 ([x, y, w, h]) and ScreenSpot-Pro
  ([x1, y1, x2, y2]) files as they ship;
- :mod:`~mmrl.data.gui_episodes` (file reading), :mod:`~mmrl.data.gui_labels` and
  :mod:`~mmrl.data.gui_odyssey` (per-dataset action mapping): AndroidControl- and GUI-Odyssey-style
  episode files; :mod:`~mmrl.data.gui_steps`: their steps as examples with their action history;
- :mod:`~mmrl.data.scenes`, :mod:`~mmrl.data.shapes_t2i`: synthetic scenes;
- :mod:`~mmrl.data.sequence`: ``LazySequence``, the base of every dataset here (``stats()``: what
  it left out), and ``SkippingSequence``, that of readers whose examples can prove unusable on access.
"""
