# Writes OUT from the template IN with the source tree's commit, at build time (a configure-time
# stamp goes stale: a build folder configured once names that commit in every trace header and
# bench report it writes afterwards). "-dirty" marks tracked files changed since the commit.
# configure_file leaves OUT untouched when nothing changed, so nothing relinks needlessly.
# Called by src/CMakeLists.txt with -DSRC -DIN -DOUT -DPROJECT_VERSION.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE ARBITER_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE rc ERROR_QUIET)
if(NOT rc EQUAL 0 OR NOT ARBITER_GIT_COMMIT)
  set(ARBITER_GIT_COMMIT "unknown")
else()
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(changes)
    string(APPEND ARBITER_GIT_COMMIT "-dirty")
  endif()
endif()
configure_file(${IN} ${OUT} @ONLY)
