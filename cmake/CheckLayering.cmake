# The layering rule, checked at configure time and by the test `structure.layering`:
#   * a component includes only its own files and the public headers (include/diaspora/*) of
#     the components it depends on (the table below, DESIGN.md's one-way arrows);
#   * its private headers (src/) are reachable from nowhere else: tests/ and bench/ reach
#     them through the *_internals targets, never a component.
# Usage: include() it from CMakeLists.txt, or cmake -DSOURCE_DIR=... -P CheckLayering.cmake.
cmake_policy(PUSH)
cmake_policy(SET CMP0057 NEW)  # if(IN_LIST) in script mode
if(NOT SOURCE_DIR)
  set(SOURCE_DIR ${PROJECT_SOURCE_DIR})
endif()

set(_components core client relay resilience plugin rehearsal engine-adapters runner cli)
set(_deps_core "")
set(_deps_client core)
set(_deps_relay core resilience)  # resilience: site_health() for the views
set(_deps_resilience core)
set(_deps_plugin core client resilience)
set(_deps_rehearsal core client plugin)  # client: ptycho-stream reads its scans' events back
set(_deps_engine-adapters core plugin)  # plugin: its C header only (loaded with dlopen)
set(_deps_runner core client relay resilience engine-adapters plugin)  # relay: embedded; plugin: its C header only
set(_deps_cli core client resilience relay plugin)  # runner: exec'd (diaspora-run), never included

# Which component's include/ holds a public header "diaspora/<name>".
function(_layering_owner header out)
  set(owner "")
  foreach(c IN LISTS _components)
    if(EXISTS "${SOURCE_DIR}/${c}/include/${header}")
      set(owner ${c})
    endif()
  endforeach()
  if(header STREQUAL "diaspora/version.hpp")  # generated from core/include/diaspora/version.hpp.in
    set(owner core)
  endif()
  set(${out} "${owner}" PARENT_SCOPE)
endfunction()

set(_problems "")
foreach(comp IN LISTS _components)
  file(GLOB_RECURSE files "${SOURCE_DIR}/${comp}/*.cpp" "${SOURCE_DIR}/${comp}/*.hpp" "${SOURCE_DIR}/${comp}/*.h"
       "${SOURCE_DIR}/${comp}/*.c")
  foreach(f IN LISTS files)
    file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
    get_filename_component(fdir "${f}" DIRECTORY)
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" inc "${line}")
      if(inc MATCHES "^diaspora/")
        _layering_owner("${inc}" owner)
        if(owner STREQUAL "")
          list(APPEND _problems "${rel}: includes \"${inc}\", which no component's include/ provides")
        elseif(NOT owner STREQUAL comp AND NOT owner IN_LIST _deps_${comp})
          list(APPEND _problems "${rel}: includes \"${inc}\" of ${owner}, which ${comp} does not depend on (allowed: ${_deps_${comp}})")
        endif()
        continue()
      endif()
      # A quoted private include: next to the file, or in the component's own src/ (its
      # targets' private include directory). It must resolve inside the component; only a
      # component's own tests may also use tests/unit's helpers.
      set(found "")
      foreach(base IN ITEMS "${fdir}" "${SOURCE_DIR}/${comp}/src")
        if(NOT found AND EXISTS "${base}/${inc}")
          get_filename_component(found "${base}/${inc}" ABSOLUTE)
        endif()
      endforeach()
      if(NOT found AND rel MATCHES "^${comp}/tests/" AND EXISTS "${SOURCE_DIR}/tests/unit/${inc}")
        continue()
      endif()
      if(NOT found)
        list(APPEND _problems "${rel}: includes \"${inc}\", which is not a file of ${comp}")
        continue()
      endif()
      file(RELATIVE_PATH target "${SOURCE_DIR}" "${found}")
      if(NOT target MATCHES "^${comp}/")
        list(APPEND _problems "${rel}: includes ${target}, a private header of another component")
      endif()
    endforeach()
  endforeach()
endforeach()

if(_problems)
  list(JOIN _problems "\n  " text)
  message(FATAL_ERROR "layering: a component reaches past another's public headers (cmake/CheckLayering.cmake):\n  ${text}")
endif()
cmake_policy(POP)
