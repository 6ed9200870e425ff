"""The code path picture: each box names its file and symbol and links to the line where the
installed release defines it, at the release's tag."""

from sglab.sglang import codepath, releases


NODE = codepath.Node("srt/mem_cache/swa_memory_pool.py", "SWAKVPool.set_kv_buffer", "the write")


def test_a_node_links_to_its_line_at_the_release_tag():
    if not releases.release_installed("0.5.11"):
        import pytest

        pytest.skip("sglang 0.5.11 is not installed (make sglang-releases)")
    line = codepath.line_of("0.5.11", NODE)
    text = (releases.package_dir("0.5.11") / NODE.path).read_text().splitlines()
    assert "def set_kv_buffer" in text[line - 1]
    assert codepath.url(
        "0.5.11",
        NODE) == ("https://github.com/sgl-project/sglang/blob/v0.5.11/python/sglang/srt/mem_cache/"
                  f"swa_memory_pool.py#L{line}")
    page = codepath.html_path("0.5.11", [NODE, NODE], "the path")
    assert page.count("<a href=") == 2 and page.count("→") == 1 and f":{line}" in page
    # a long name wraps at its dots and slashes, not inside a word: a break offered after each
    assert page.count("<code style='font-size:12px'>SWAKVPool.<wbr>set_kv_buffer</code>") == 2
    assert page.count(f"srt/<wbr>mem_cache/<wbr>swa_memory_pool.py:{line}</small>") == 2


def test_a_symbol_the_release_lacks_links_to_its_file():
    gone = codepath.Node("srt/mem_cache/swa_memory_pool.py", "NoSuchClass.f")
    assert codepath.line_of("0.5.11", gone) is None
    assert codepath.url("0.5.11", gone).endswith("swa_memory_pool.py")
    assert codepath.line_of("9.9.9", NODE) is None
