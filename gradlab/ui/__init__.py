"""The Streamlit glue (the only part of gradlab that imports Streamlit), one module per job:

- `state`: the experiment sidebar bound to the URL, share links, presets' glue;
- `cache`: page computations shared through one store and gate (`shared`, `on_request`, `fitted`), memory hygiene;
- `upload`: the CSV uploader and this session's upload;
- `figures`: figures shared by every session, in this session's style (`half_column`);
- `card`: the per-example record's page and the links and clicks that open it (`open_card`, `card_link`), and the
  audit canary's (`canary_link`, `open_canary`);
- `audit`: the DP-SGD audit both the Privacy audit page and the canary's card show (imported as a module);
- `geometry`: the Geometry page's removal of an example, which its examples' cards show too (imported as a module);
- `points`: a page's block that a lecture step opens on (`point`), and the controls its figure reads (`point_controls`);
- `widgets`: error guard, code panel, checkpoint picker, downloads, charts, tables; `inert` (a user's text in Markdown).

Pages import `from gradlab import ui` and use the names re-exported here.
"""

from gradlab.ui.cache import (data, equivalence_plan, fill_store_in_background, fitted, macs, num_examples, num_params, on_request, practice_wait,
                              requested, sandboxed, shared, summary_seconds, summary_size)
from gradlab.ui.state import (DEFAULT, LEARNING_RATES, STEPS, apply_preset, experiment, experiment_from_state,
                              experiment_sidebar, follow_preset, preset_banner, preset_picker, remember_url,
                              share_link, url_warnings)
from gradlab.ui.card import canary_link, card_link, open_canary, open_card, selected_row
from gradlab.ui.figures import half_column
from gradlab.ui.points import controls as point_controls
from gradlab.ui.points import point
from gradlab.ui.upload import UPLOAD_LABEL, upload_controls, uploaded
from gradlab.ui.widgets import (chart, checkpoint_picker, choice, intro, code_panel, control, dataframe, download, download_gradients, fragment, guard, inert,
                                needs_training_loop, picked_index, plotly_config, terms, write_bound_values,
                                STEP_SETS_CONTROLS)

__all__ = [
    "DEFAULT", "LEARNING_RATES", "STEPS", "STEP_SETS_CONTROLS", "UPLOAD_LABEL",
    "apply_preset", "canary_link", "card_link", "chart", "data", "equivalence_plan", "checkpoint_picker", "choice", "control", "code_panel", "dataframe", "download", "download_gradients",
    "experiment", "experiment_from_state", "experiment_sidebar", "fill_store_in_background", "fitted", "fragment", "follow_preset", "guard", "half_column", "inert", "intro",
    "macs", "needs_training_loop", "open_canary", "open_card", "selected_row", "practice_wait", "sandboxed", "num_examples", "num_params", "picked_index", "plotly_config", "point", "point_controls", "preset_banner", "preset_picker", "on_request", "requested",
    "summary_seconds", "summary_size",
    "remember_url", "share_link", "shared", "url_warnings", "write_bound_values", "terms", "upload_controls", "uploaded",
]
