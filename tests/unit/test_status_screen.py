"""The status screen (pure output logic): in-place redraw on a terminal, framed text and JSON Lines when piped."""

from __future__ import annotations

import io
import json
from dataclasses import replace

from worker_lib.cli.status import FleetStatus, Screen, ShardLag, WorkerRow, cluster_of, load_bar, render


def status(leases: int) -> FleetStatus:
    row = WorkerRow(
        worker="eu-a/host:1",
        cluster="eu-a",
        leases=leases,
        throughput_kbps=12.5,
        cpu=41.2,
        report_age_s=3.0,
        active=True,
        load_vs_mean=1.1,
    )
    return FleetStatus(
        app="orders",
        leader="w1:leader",
        leases=leases,
        finished=0,
        unassigned=[],
        orphaned=[],
        expired=[],
        handoffs=[],
        cap=None,
        workers=[row],
        time="2026-11-25T20:00:00+00:00",
    )


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_second_frame_is_drawn_over_the_first_without_clearing_the_screen() -> None:
    out = Terminal()
    screen = Screen(out, as_json=False, interactive=out.isatty())
    screen.show(status(3), watch=True)
    first = out.getvalue()
    screen.show(status(4), watch=True)
    second = out.getvalue()[len(first) :]
    assert first.startswith("\x1b[2J\x1b[H")  # the first frame clears once
    assert second.startswith("\x1b[H") and "\x1b[2J" not in second  # then: cursor home, overwrite
    assert second.endswith("\x1b[J") and all(line.endswith("\x1b[K") for line in second.split("\n")[:-1])


def test_piped_text_frames_are_headed_by_their_time_and_json_frames_are_one_line_each() -> None:
    text, lines = io.StringIO(), io.StringIO()
    for screen, out in (
        (Screen(text, as_json=False, interactive=False), text),
        (Screen(lines, as_json=True, interactive=False), lines),
    ):
        screen.show(status(3), watch=True)
        screen.show(status(4), watch=True)
        assert "\x1b[" not in out.getvalue()
    assert text.getvalue().count("--- 2026-11-25T20:00:00+00:00 ---") == 2
    frames = [json.loads(line) for line in lines.getvalue().splitlines()]
    assert [frame["leases"] for frame in frames] == [3, 4]


def test_clusters_come_from_the_worker_id_prefix_before_a_slash() -> None:
    assert cluster_of("eu-a/ip-10-0-0-1:42") == "eu-a"
    assert cluster_of("ip-10-0-0-1:42") == "-"  # a default host:pid id names no cluster (was: "ip")
    assert cluster_of("/x") == "-"


def test_a_load_bar_fills_half_at_the_mean_and_all_at_twice_the_mean() -> None:
    assert load_bar(1.0).startswith("█" * 10 + "░" * 10) and load_bar(1.0).endswith("1.00×")
    assert load_bar(3.0).startswith("█" * 20)
    assert load_bar(None).strip() == "-"


def test_a_shard_in_lanes_shows_its_records_in_flight_and_watermark_lag_beside_its_lag_and_others_do_not() -> None:
    # GIVEN two lagging shards, the first processed in lanes
    lags = [
        ShardLag(lease="shard-1", owner="w1", millis_behind=90_000, in_flight=1_200, watermark_lag_ms=3_400),
        ShardLag(lease="shard-2", owner="w1", millis_behind=12),
    ]
    fleet = replace(status(2), lags=lags)
    # WHEN rendered as text and as JSON
    lines = render(fleet).splitlines()
    frame = json.loads(json.dumps(fleet.to_dict()))
    # THEN the shard in lanes shows both beside its lag, the other nothing more than its lag
    (first,) = [line for line in lines if "shard-1" in line]
    (second,) = [line for line in lines if "shard-2" in line]
    assert first.split() == ["shard-1", "90,000", "ms", "w1", "in", "flight", "1,200,", "watermark", "lag", "3.4", "s"]
    assert second.split() == ["shard-2", "12", "ms", "w1"]
    # AND JSON carries them, null for the shard without lanes
    assert [(lag["in_flight"], lag["watermark_lag_ms"]) for lag in frame["lags"]] == [(1_200, 3_400), (None, None)]
