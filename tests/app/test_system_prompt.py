"""The system prompt: the palette's dialog, per chat and for new chats, in the store, to the engine."""

from __future__ import annotations

from pathlib import Path

from app.export import chat_markdown
from app.screens import SystemPromptScreen
from app.screens.chat import SETTING_SYSTEM
from app.store import ChatStore
from engine.cli import build_parser

from .fakes import FakeEngine
from .test_chat import SIZE, make_app, messages, notices, ready, screen_text, send, reply_done, wait_for
from .test_chat_features import chat, prompt, saved, shown


def test_store_sets_replaces_and_removes_a_chats_system_prompt(tmp_path: Path) -> None:
    store = ChatStore.open(tmp_path / "s.db")
    c = store.new_chat()
    store.add_message(c, "user", "hi")
    store.add_message(c, "assistant", "hello", {"finish_reason": "eos"})
    store.set_system(c, "Be terse.")  # inserted first, the others move one on in order
    rows = store.messages(c)
    assert [(m.idx, m.role, m.content) for m in rows] == [(0, "system", "Be terse."), (1, "user", "hi"), (2, "assistant", "hello")]
    assert rows[2].finish_reason == "eos"
    store.set_system(c, "Be kind.")  # replaced in place
    assert [(m.idx, m.content) for m in store.messages(c)] == [(0, "Be kind."), (1, "hi"), (2, "hello")]
    assert store.chats()[0].messages == 2  # the list counts the conversation, not the system prompt
    store.set_system(c, "")  # removed, the others move back
    assert [(m.idx, m.role) for m in store.messages(c)] == [(0, "user"), (1, "assistant")]
    store.set_system(c, "")  # nothing to remove: nothing changes
    assert len(store.messages(c)) == 2
    assert store.chats()[0].title == "hi"


def test_export_names_the_system_prompt() -> None:
    md = chat_markdown("T", [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}])
    assert "## System prompt\n\nBe terse.\n\n## You\n\nhi" in md


async def open_dialog(pilot, app) -> SystemPromptScreen:
    await pilot.press("ctrl+p")
    await pilot.pause()
    await pilot.press(*"System prompt")
    await pilot.pause(0.3)
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(app.screen, SystemPromptScreen))
    return app.screen


async def type_into(pilot, dialog: SystemPromptScreen, text: str, for_new: bool | None = None) -> None:
    box = dialog.query_one("#system-text")
    box.text = ""
    await pilot.press(*text)
    if for_new is not None:
        dialog.query_one("#system-default").value = for_new
    await pilot.press("enter")
    await pilot.pause()


async def test_the_system_prompt_of_a_new_chat_goes_to_the_engine_and_to_new_chats(data_dir: Path) -> None:
    engine = FakeEngine(["Ok", "."])
    app = make_app(engine)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await ready(pilot)
        dialog = await open_dialog(pilot, app)
        assert dialog.query_one("#system-default").value  # a new chat: "also for new chats" ticked
        await type_into(pilot, dialog, "Answer in French.")
        assert not isinstance(app.screen, SystemPromptScreen)
        assert shown(app) == [("system", "*System prompt:* Answer in French.")]
        assert ("System prompt set for this chat and new chats.", "information") in notices(app)
        await chat(pilot, "Hello")
        assert engine.calls[-1] == [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello"}]
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert shown(app) == [("system", "*System prompt:* Answer in French.")]  # the default carries
        await chat(pilot, "Second chat")
        assert engine.calls[-1][0] == {"role": "system", "content": "Answer in French."}
    store = saved(data_dir)
    assert store.get_setting(SETTING_SYSTEM) == "Answer in French."
    for record in store.chats():
        assert [m.role for m in store.messages(record.id)] == ["system", "user", "assistant"]
        assert record.messages == 2 and record.title in ("Hello", "Second chat")


async def test_changing_a_chats_system_prompt_mid_chat_only_for_this_chat(data_dir: Path) -> None:
    engine = FakeEngine(["Sure", "."])
    app = make_app(engine)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "one", "two")
        dialog = await open_dialog(pilot, app)
        assert not dialog.query_one("#system-default").value  # a chat under way without one: not the default
        await type_into(pilot, dialog, "Be brief.")
        assert shown(app)[0] == ("system", "*System prompt:* Be brief.") and len(messages(app)) == 5
        assert ("System prompt set for this chat.", "information") in notices(app)
        await chat(pilot, "three")
        assert [m["role"] for m in engine.calls[-1]] == ["system", "user", "assistant", "user", "assistant", "user"]
        # cleared again: the chat goes back to the model's default, messages in order
        dialog = await open_dialog(pilot, app)
        assert dialog.query_one("#system-text").text == "Be brief."
        await type_into(pilot, dialog, "")
        assert [r for r, _ in shown(app)] == ["user", "assistant"] * 3
        assert ("System prompt cleared for this chat.", "information") in notices(app)
        # Esc leaves it as it was
        dialog = await open_dialog(pilot, app)
        await pilot.press(*"ignored", "escape")
        await pilot.pause()
        assert [r for r, _ in shown(app)] == ["user", "assistant"] * 3
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert shown(app) == []  # new chats never got it
    (record,) = saved(data_dir).chats()
    assert [m.content for m in saved(data_dir).messages(record.id)] == ["one", "Sure.", "two", "Sure.", "three", "Sure."]
    assert saved(data_dir).get_setting(SETTING_SYSTEM) is None


async def test_a_failed_first_message_with_a_system_prompt_saves_no_chat(data_dir: Path) -> None:
    engine = FakeEngine([""], finish_reason="error")
    app = make_app(engine, system_prompt="Be terse.")  # `specchat chat --system`
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert shown(app) == [("system", "*System prompt:* Be terse.")]
        await send(pilot, "hello")
        await reply_done(pilot)
        assert prompt(app).text == "hello" and shown(app) == [("system", "*System prompt:* Be terse.")]
        assert app.chat.conversation == [{"role": "system", "content": "Be terse."}]
        await app.chat.action_regenerate()
        await pilot.pause()
        assert any("Nothing to regenerate yet" in m for m, _ in notices(app))
        assert "System prompt" in screen_text(app)
    assert saved(data_dir).chats() == []
    assert saved(data_dir).get_setting(SETTING_SYSTEM) is None  # the flag is for this run only


async def test_system_prompt_edge_cases(data_dir: Path) -> None:
    """--system opens a new chat (the last saved one keeps its own); an unchanged prompt says so;
    the dialog waits while the last message is being edited; chat search skips system prompts."""
    store = ChatStore.open(data_dir / "specchat.db")
    old = store.new_chat()
    store.add_message(old, "user", "an older chat")
    store.close()
    engine = FakeEngine(["Ok"])
    app = make_app(engine, system_prompt="Speak like a pirate.")
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await ready(pilot)
        assert shown(app) == [("system", "*System prompt:* Speak like a pirate.")] and app.chat.chat_id is None
        await chat(pilot, "Ahoy")
        dialog = await open_dialog(pilot, app)
        await pilot.press("enter")  # the same text, the default unchanged
        await pilot.pause()
        assert ("System prompt unchanged.", "information") in notices(app)
        app.chat.action_edit_last()
        await pilot.pause()
        app.chat.action_system_prompt()
        await pilot.pause()
        assert not isinstance(app.screen, SystemPromptScreen)
        assert any("edit of your last message first" in m for m, _ in notices(app))
    store = saved(data_dir)
    assert [c.title for c in store.chats("pirate")] == []  # the system prompt is not what a search finds
    assert [c.title for c in store.chats("Ahoy")] == ["Ahoy"]


def test_the_chat_command_takes_a_system_prompt() -> None:
    args = build_parser().parse_args(["chat", "--system", "Be terse."])
    assert args.system == "Be terse."
    assert build_parser().parse_args(["chat"]).system is None


async def test_the_dialog_keeps_its_checkbox_on_a_small_terminal(data_dir: Path) -> None:
    """At 60x15 (and 60x11) the help line goes and the text box shrinks: the checkbox stays
    visible and usable; at full height the box has its 8 rows and the help is back."""
    for size in ((60, 15), (60, 11)):
        app = make_app(FakeEngine(["Ok"]))
        async with app.run_test(size=size) as pilot:
            await ready(pilot)
            dialog = await open_dialog(pilot, app)
            await pilot.pause()
            check = dialog.query_one("#system-default")
            region = check.region
            assert region.height >= 1 and region.bottom <= size[1], (size, region)
            assert not dialog.query_one("#system-help").display
            assert dialog.query_one("#system-text").region.height >= 3
            await pilot.resize_terminal(100, 30)
            await pilot.pause()
            assert dialog.query_one("#system-help").display and dialog.query_one("#system-text").region.height == 8
            await pilot.press("escape")
