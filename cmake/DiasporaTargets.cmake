# Per-target build settings: warnings and sanitizers are set on Diaspora's own targets
# only, never globally (so a parent project or a third-party header is not affected).

function(diaspora_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
        -Wcast-align -Wunused -Woverloaded-virtual -Wimplicit-fallthrough>
    $<$<COMPILE_LANG_AND_ID:C,GNU,Clang>:-Wall -Wextra -Wpedantic -Wshadow>)
  if(DIASPORA_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(DIASPORA_FUZZ)
    # libFuzzer's coverage in every Diaspora target (the fuzz targets link -fsanitize=fuzzer).
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer-no-link)
  endif()
  if(DIASPORA_SANITIZE)
    if(NOT DIASPORA_SANITIZE MATCHES "^(address,undefined|undefined,address|address|undefined|thread)$")
      message(FATAL_ERROR "DIASPORA_SANITIZE='${DIASPORA_SANITIZE}': use 'address,undefined' or 'thread'")
    endif()
    # At -O0 (Debug): at -O1 the sanitized build took 20 min on 2 cores (cold CI,
    # 2026-12-04) for little test time gained (docs/building.md, "Tests").
    target_compile_options(${target} PRIVATE -fsanitize=${DIASPORA_SANITIZE} -fno-omit-frame-pointer)
    if(DIASPORA_SANITIZE MATCHES "undefined")
      # Undefined behaviour stops the process (a report, then exit non-zero) instead of being
      # printed and passed over: a test that hits it fails.
      target_compile_options(${target} PRIVATE -fno-sanitize-recover=undefined)
    endif()
    # A sanitized static library needs the sanitizer runtime wherever it is linked,
    # including in an installed consumer's project: make that part of its interface.
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "STATIC_LIBRARY")
      target_link_options(${target} INTERFACE -fsanitize=${DIASPORA_SANITIZE})
    else()
      target_link_options(${target} PRIVATE -fsanitize=${DIASPORA_SANITIZE})
    endif()
  endif()
endfunction()

# Turns schemas/*.json into a generated .cpp so the binaries carry their schemas and work
# from any directory; schemas/ stays the single source of truth.
function(diaspora_embed_schemas out_var)
  file(GLOB_RECURSE schema_files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/schemas/*.json)
  set(out ${PROJECT_BINARY_DIR}/generated/embedded_schemas.cpp)
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DSCHEMA_DIR=${PROJECT_SOURCE_DIR}/schemas -DOUT=${out}
            -P ${PROJECT_SOURCE_DIR}/cmake/EmbedSchemas.cmake
    DEPENDS ${schema_files} ${PROJECT_SOURCE_DIR}/cmake/EmbedSchemas.cmake
    COMMENT "Embedding JSON schemas"
    VERBATIM)
  set(${out_var} ${out} PARENT_SCOPE)
endfunction()
