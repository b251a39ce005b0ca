"""Scoring primitives shared by reward plugins and task metrics, one topic per module.

A reward and the metric of the task it scores must agree to the digit (a gallery that marks an
answer right that the reward scored 0 is a bug report waiting to happen), so both call these
functions instead of each keeping its own copy. Public: plugins may import them (:mod:`mmrl.public`).

- :mod:`~mmrl.measures.batch`: the batch-length check and per-pair loop every reward shares;
- :mod:`~mmrl.measures.boxes`: box IoU, the IoU of a completion's box with the example's;
- :mod:`~mmrl.measures.detection`: multi-box answers, greedy matching, det_iou, AP50, criterion;
- :mod:`~mmrl.measures.answers`: exact answers (numeric-aware accuracy, No-Thinking equality);
- :mod:`~mmrl.measures.text`: Levenshtein, edit similarity, ANLS;
- :mod:`~mmrl.measures.relaxed`: ChartQA's relaxed accuracy;
- :mod:`~mmrl.measures.math_equivalence`: mathematical answer equivalence (Math-Verify, plus mmrl's documented rules);
- :mod:`~mmrl.measures.jigsaw`: tile-position answers;
- :mod:`~mmrl.measures.composition`: the GenEval-style checker of generated shape scenes;
- :mod:`~mmrl.measures.motion`: the same checks tracked through a generated clip (colour, shape, direction);
- :mod:`~mmrl.measures.gui`: the GUI action space and its tolerant parser;
  :mod:`~mmrl.measures.gui_match`: a predicted action against the label (type, arguments, text F1);
- :mod:`~mmrl.measures.ui_r1`, :mod:`~mmrl.measures.gui_r1`: UI-R1's and GUI-R1's rewards as their code computes them;
- :mod:`~mmrl.measures.screen`: screen grounding clicks: point in box, GUI-G² Gaussian point and coverage;
- :mod:`~mmrl.measures.pass_at_k`: the unbiased pass@k estimator over several samples per example;
- :mod:`~mmrl.measures.temporal`: time segments in answers and their temporal IoU;
- :mod:`~mmrl.measures.video_r1`: Video-R1's accuracy reward as its code computes it;
  :mod:`~mmrl.measures.video_answers`: mmrl's reading of the same grading;
- :mod:`~mmrl.measures.rouge`: ROUGE-N / ROUGE-L and word error rate (Video-R1's free-form and OCR rewards),
  with :mod:`~mmrl.measures.porter`, the Porter stemmer of ``rouge_score``.

Like :mod:`mmrl.parsing`, nothing here raises on model output.
"""
