"""The phone of :mod:`mmrl.envs.synthetic_gui`: its state, the clickable elements of each screen,
and how a screen is drawn.

Why this look: the tiny default VLM sees one vision token per 28-px cell and was pretrained on
the coloured shapes of :mod:`mmrl.data.scenes`. So every element the agent must find has a
FIXED (colour, shape) icon of those scenes (an app, a setting, a message's sender, the form's
field and button, a dialog's buttons), icons are distinct within a screen, and text labels are
extras, drawn only when cells are large enough to read them (for real models).

The grid is 4 columns x 8 rows of ``cell`` pixels: row 0 the status bar (Wi-Fi and Bluetooth
indicators), row 1 an app's header (a Back button in column 0, the app's icon in column 3),
rows 2-6 its content. Element boxes are the cells' bounds ``(x1, y1, x2, y2)``: neighbouring
boxes share an edge, and a click on a shared edge goes to the first element listed.
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image, ImageDraw

from mmrl.data.scenes import BACKGROUND, SceneObject, draw_object
from mmrl.media.draw import bitmap_font, bitmap_text

COLS, ROWS = 4, 8
CONTENT_ROW = 2  # first content row of an app screen (row 0: status bar, row 1: header)
VISIBLE = 5  # message rows on screen at a time (rows 2-6)

APPS = ("Settings", "Messages", "Contacts")  # the apps the tasks use
DECOYS = ("Camera", "Clock", "Music")
APP_ICONS = {"Settings": ("blue", "square"), "Messages": ("green", "circle"), "Contacts": ("yellow", "triangle"),
             "Camera": ("red", "circle"), "Clock": ("yellow", "square"), "Music": ("red", "triangle")}
SETTINGS = ("Wi-Fi", "Bluetooth", "Airplane mode", "Dark mode")
SETTING_ICONS = {"Wi-Fi": ("blue", "circle"), "Bluetooth": ("blue", "triangle"),
                 "Airplane mode": ("red", "square"), "Dark mode": ("green", "square")}
NAMES = ("Ada", "Bob", "Cy", "Dee", "Eve", "Fay", "Gus", "Hal", "Ivy", "Jo")  # senders and form names
SENDER_ICONS = dict(zip(NAMES, [("red", "circle"), ("blue", "square"), ("yellow", "triangle"), ("green", "square"),
                                ("red", "triangle"), ("blue", "circle"), ("yellow", "square"), ("green", "triangle"),
                                ("red", "square"), ("blue", "triangle")]))
FIELD_ICON, SUBMIT_ICON = ("blue", "circle"), ("green", "square")
ALLOW_ICON, DENY_ICON = ("green", "circle"), ("red", "square")
TEXTS = ("Lunch today?", "Call me back", "See you at 6", "Got the files", "Happy birthday!", "On my way",
         "Thanks a lot", "Meeting moved", "Nice photo", "Good night")

INK, MUTED, HEADER, STATUS = (40, 40, 40), (170, 170, 170), (225, 228, 235), (205, 205, 205)
SWITCH_ON = (30, 160, 50)
FOCUS = (30, 60, 220)


@dataclass
class Phone:
    """The whole state of one episode: the layout (fixed by the task seed) and what changes.
    ``screen`` is home / settings / messages / message / contacts / app (a decoy app's empty
    screen); ``dialog`` is the notification dialog shown over ``app``'s screen."""

    seed: int
    home: dict[str, int]  # app -> cell index on the home screen (reading order)
    order: list[str]  # settings, top to bottom
    senders: list[str]  # the message list, top to bottom
    field_row: int
    submit: tuple[int, int]  # (col, row)
    dialog_cols: tuple[int, int]  # (Allow, Deny) columns of the dialog's button row
    asks: set[str]  # apps that still show the dialog when opened
    toggles: dict[str, bool]
    screen: str = "home"
    app: str = ""
    scroll: int = 0
    opened: int = -1  # index of the open message
    focus: bool = False
    text: str = ""
    dialog: bool = False

    def key(self) -> str:
        """The canonical state string (equal strings: the same state, same layout)."""
        bits = "".join("1" if self.toggles[s] else "0" for s in SETTINGS)
        return (f"seed={self.seed}|screen={self.screen}|app={self.app}|toggles={bits}|scroll={self.scroll}"
                f"|opened={self.opened}|focus={int(self.focus)}|text={self.text!r}|dialog={int(self.dialog)}"
                f"|asks={','.join(sorted(self.asks))}")


def cell_box(col: int, row: int, cell: int, width: int = 1) -> tuple[int, int, int, int]:
    return (col * cell, row * cell, (col + width) * cell, (row + 1) * cell)


def elements(p: Phone, cell: int) -> list[tuple[dict, tuple]]:
    """The clickable elements of the current screen as ``(element dict, target)``, the target
    saying what a click does: ("open", app), ("back",), ("toggle", setting), ("read", index),
    ("focus",), ("submit",), ("allow",), ("deny",). With the dialog up, only its buttons."""
    def el(name, role, box, *target):
        return {"name": name, "role": role, "box": box}, target

    if p.dialog:
        return [el("Allow button", "button", cell_box(p.dialog_cols[0], 5, cell), "allow"),
                el("Deny button", "button", cell_box(p.dialog_cols[1], 5, cell), "deny")]
    if p.screen == "home":
        return [el(f"{app} app", "app", cell_box(i % COLS, i // COLS, cell), "open", app)
                for app, i in sorted(p.home.items(), key=lambda kv: kv[1])]
    out = [el("Back button", "button", cell_box(0, 1, cell), "back")]
    if p.screen == "settings":
        out += [el(f"{s} toggle", "switch", cell_box(3, CONTENT_ROW + i, cell), "toggle", s)
                for i, s in enumerate(p.order)]
    elif p.screen == "messages":
        out += [el(f"Message from {p.senders[i]}", "list item", cell_box(0, CONTENT_ROW + i - p.scroll, cell, COLS),
                   "read", i) for i in range(p.scroll, min(len(p.senders), p.scroll + VISIBLE))]
    elif p.screen == "contacts":
        out += [el("Name field", "text field", cell_box(0, p.field_row, cell, 3), "focus"),
                el("Submit button", "button", cell_box(*p.submit, cell), "submit")]
    return out


# -- drawing -----------------------------------------------------------------------------------------
def _icon(draw, icon, col, row, cell, label=None, font=None) -> None:
    """A scene shape centred in a cell (in its upper part, with ``label`` under it, when labelled)."""
    color, shape = icon
    side = round(cell * (0.5 if label and font else 0.64))
    x1 = col * cell + (cell - side) // 2
    y1 = row * cell + ((cell - side) // 2 if not (label and font) else max(1, cell // 12))
    draw_object(draw, SceneObject(shape, color, (x1, y1, x1 + side, y1 + side)))
    if label and font:
        _text(draw, label, col * cell + 2, row * cell + cell - 12, cell - 4, font, center=True)


def _text(draw, text, x, y, width, font, color=INK, center=False) -> None:
    text = bitmap_text(text[: max(1, width // 6)])
    if center:
        x += max(0, (width - 6 * len(text)) // 2)
    draw.text((x, y), text, fill=color, font=font)


def _switch(draw, on: bool, col, row, cell) -> None:
    """An Android-like switch: a green track with the knob right (on), a grey one with it left (off)."""
    x1, y1 = col * cell + cell // 8, row * cell + cell * 3 // 10
    x2, y2 = (col + 1) * cell - cell // 8, (row + 1) * cell - cell * 3 // 10
    draw.rectangle([x1, y1, x2, y2], fill=SWITCH_ON if on else MUTED)
    k = y2 - y1 - 2
    kx = x2 - 1 - k if on else x1 + 1
    draw.rectangle([kx, y1 + 1, kx + k, y1 + 1 + k], fill=(255, 255, 255))


def _status_bar(draw, p: Phone, cell, font) -> None:
    """Row 0: the time (labelled screens) and Wi-Fi / Bluetooth indicators, dark when on."""
    draw.rectangle([0, 0, COLS * cell - 1, cell - 1], fill=STATUS)
    if font:
        _text(draw, "12:00", 4, (cell - 11) // 2, 2 * cell, font)
    s = max(4, cell // 4)
    cy = cell // 2
    wx = 2 * cell + cell // 2  # Wi-Fi: a fan (upper quarter of a disc)
    wifi = [wx - s, cy - s, wx + s, cy + s]
    if p.toggles["Wi-Fi"]:
        draw.pieslice(wifi, 225, 315, fill=INK)
    else:
        draw.pieslice(wifi, 225, 315, outline=MUTED)
    bx = 3 * cell + cell // 2  # Bluetooth: the rune's zigzag
    rune = [(bx - s // 2, cy - s // 2), (bx + s // 2, cy + s // 2), (bx, cy + s), (bx, cy - s),
            (bx + s // 2, cy - s // 2), (bx - s // 2, cy + s // 2)]
    draw.line(rune, fill=INK if p.toggles["Bluetooth"] else MUTED, width=2 if p.toggles["Bluetooth"] else 1)


def _header(draw, p: Phone, cell, font, title: str, icon) -> None:
    """Row 1 of an app: a Back chevron (column 0), the title, the app's icon (column 3)."""
    draw.rectangle([0, cell, COLS * cell - 1, 2 * cell - 1], fill=HEADER)
    m = cell // 2
    draw.line([(m + cell // 8, cell + cell // 4), (m - cell // 8, cell + m), (m + cell // 8, 2 * cell - cell // 4)],
              fill=INK, width=max(2, cell // 14))
    if font:
        _text(draw, title, cell + 2, cell + (cell - 11) // 2, 2 * cell - 4, font)
    _icon(draw, icon, 3, 1, cell)


def render(p: Phone, cell: int, labels: bool) -> Image.Image:
    """The screenshot of the current state."""
    width, height = COLS * cell, ROWS * cell
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    font = bitmap_font() if labels else None
    _status_bar(draw, p, cell, font)
    if p.screen == "home":
        for app, i in p.home.items():
            _icon(draw, APP_ICONS[app], i % COLS, i // COLS, cell, app, font)
    else:
        _header(draw, p, cell, font, p.app if p.screen != "message" else p.senders[p.opened], APP_ICONS[p.app])
    if p.screen == "settings":
        for i, s in enumerate(p.order):
            _icon(draw, SETTING_ICONS[s], 0, CONTENT_ROW + i, cell)
            if font:
                _text(draw, s, cell + 2, (CONTENT_ROW + i) * cell + (cell - 11) // 2, 2 * cell - 4, font)
            _switch(draw, p.toggles[s], 3, CONTENT_ROW + i, cell)
    elif p.screen == "messages":
        for j, i in enumerate(range(p.scroll, min(len(p.senders), p.scroll + VISIBLE))):
            row = CONTENT_ROW + j
            _icon(draw, SENDER_ICONS[p.senders[i]], 0, row, cell)
            draw.line([(cell, (row + 1) * cell - 1), (width - 1, (row + 1) * cell - 1)], fill=STATUS)
            if font:
                _text(draw, p.senders[i], cell + 2, row * cell + 4, 3 * cell - 8, font)
                _text(draw, TEXTS[i], cell + 2, row * cell + 18, 3 * cell - 8, font, color=(110, 110, 110))
        top, span = CONTENT_ROW * cell, VISIBLE * cell  # scrollbar: where the visible rows are
        draw.rectangle([width - 3, top + span * p.scroll // len(p.senders),
                        width - 1, top + span * (p.scroll + VISIBLE) // len(p.senders) - 1], fill=MUTED)
    elif p.screen == "message":
        _icon(draw, SENDER_ICONS[p.senders[p.opened]], 0, CONTENT_ROW, cell)
        draw.rectangle([cell // 4, 3 * cell, width - cell // 4, 5 * cell - cell // 4], fill=HEADER)
        if font:
            _text(draw, p.senders[p.opened], cell + 2, CONTENT_ROW * cell + (cell - 11) // 2, 2 * cell, font)
            _text(draw, TEXTS[p.opened], cell // 4 + 4, 3 * cell + 6, width - cell, font)
    elif p.screen == "contacts":
        row = p.field_row
        _icon(draw, FIELD_ICON, 0, row, cell)
        box = [cell + 1, row * cell + cell // 5, 3 * cell - 2, (row + 1) * cell - cell // 5]
        draw.rectangle(box, fill=(255, 255, 255), outline=FOCUS if p.focus else MUTED, width=2 if p.focus else 1)
        shown = p.text or ("Name" if font and not p.focus else "")
        font_or_bitmap = font or bitmap_font()  # the typed text is state, drawn at every size
        ty = (box[1] + box[3]) // 2 - 5
        _text(draw, shown + ("|" if p.focus else ""), cell + 4, ty, 2 * cell - 8, font_or_bitmap,
              color=INK if p.text else MUTED)
        _icon(draw, SUBMIT_ICON, *p.submit, cell, "Submit", font)
    if p.dialog:
        image = Image.blend(image, Image.new("RGB", image.size, (60, 60, 60)), 0.5)
        draw = ImageDraw.Draw(image)
        draw.rectangle([2, 3 * cell + 2, width - 3, 6 * cell - 3], fill=(255, 255, 255), outline=INK)
        if font:
            _text(draw, "Allow notifications?", 6, 3 * cell + 8, width - 12, font)
        _icon(draw, ALLOW_ICON, p.dialog_cols[0], 5, cell, "Allow", font)
        _icon(draw, DENY_ICON, p.dialog_cols[1], 5, cell, "Deny", font)
    return image
