"""StopScan: stop strings over a text fed in pieces, a possible start held back, the text cut before a match."""

from __future__ import annotations

from tokenomy.engine.stops import StopScan


def test_stop_strings_match_across_pieces_and_hold_back_a_possible_start():
    scan = StopScan(["END"])
    assert scan.feed("abc E") == ("abc ", False)          # "E" may start END: held back
    assert scan.feed("N") == ("", False)
    assert scan.feed("D and more") == ("", True)           # matched across three pieces: cut before it
    assert scan.text == "abc "
    scan = StopScan(["END"])
    assert scan.feed("abc E") == ("abc ", False)
    assert scan.feed("x", final=True) == ("Ex", False)    # the held-back start was not a stop after all
    assert StopScan([]).feed("anything") == ("anything", False)


def test_the_first_stop_string_in_the_text_cuts_it_whichever_is_listed_first():
    scan = StopScan(["world", "lo"])
    assert scan.matched is None
    assert scan.feed("hello world") == ("hel", True)
    assert scan.text == "hel" and scan.sent == 3
    assert scan.matched == "lo"                            # which one cut it: a Messages answer's stop_sequence


def test_a_held_back_start_is_released_once_the_next_piece_rules_it_out():
    scan = StopScan(["ab", "xyz"])
    assert scan.feed("1 xy") == ("1 ", False)              # "xy" may start "xyz"
    assert scan.feed("a") == ("xy", False)                 # "xya": not xyz; "a" may start "ab"
    assert scan.feed("c") == ("ac", False)


def test_release_all_sends_a_held_back_start_without_matching():
    scan = StopScan(["END"])
    assert scan.feed("one EN") == ("one ", False)
    assert scan.release_all("D") == "END"                  # handed over whole: the next reader matches it
    assert scan.text == "one END" and scan.sent == len(scan.text)
    assert scan.feed(" more") == (" more", False)          # a stop already sent is not matched again
