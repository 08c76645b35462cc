# The chat templates of families whose GGUFs may carry none, compiled into `target` from their
# .jinja sources (tests/oracle/gen_chat_template_fixtures.py renders the same files with jinja2):
# OUT_DIR/common/text/default_templates.inc, on `target`'s include path.
function(bitsplit_default_templates target out_dir)
  set(dir ${CMAKE_CURRENT_FUNCTION_LIST_DIR})
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${dir}/gemma.jinja)
  file(READ ${dir}/gemma.jinja BITSPLIT_GEMMA_TEMPLATE)
  configure_file(${dir}/default_templates.inc.in ${out_dir}/common/text/default_templates.inc @ONLY)
  target_include_directories(${target} PRIVATE ${out_dir})
endfunction()
