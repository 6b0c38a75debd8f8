# chorus_add_schema(<target> <folder> <schema.fbs>...): compiles FlatBuffers schemas with Debian's
# flatc at build time into an INTERFACE library <target>. The generated headers land in the build
# tree as "<folder>/<stem>_generated.h" (include them by that name). The runtime's schema is one
# (schema/), and every mode compiles its own next to its code (ping/ping.fbs, ps/ps.fbs, ...), so
# chorus_node builds without any mode's messages.
function(chorus_add_schema target folder)
  set(out_dir ${CMAKE_CURRENT_BINARY_DIR}/generated/${folder})
  set(generated_headers)
  foreach(fbs IN LISTS ARGN)
    get_filename_component(path ${fbs} ABSOLUTE)
    get_filename_component(stem ${fbs} NAME_WE)
    set(out ${out_dir}/${stem}_generated.h)
    add_custom_command(
      OUTPUT ${out}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${out_dir}
      COMMAND ${FLATC} --cpp --scoped-enums -o ${out_dir} ${path}
      DEPENDS ${path}
      COMMENT "flatc: compiling ${folder}/${stem}.fbs"
      VERBATIM)
    list(APPEND generated_headers ${out})
  endforeach()
  add_custom_target(${target}_gen DEPENDS ${generated_headers})
  add_library(${target} INTERFACE)
  add_dependencies(${target} ${target}_gen)
  target_include_directories(${target} INTERFACE ${CMAKE_CURRENT_BINARY_DIR}/generated)
  target_link_libraries(${target} INTERFACE flatbuffers::flatbuffers)
endfunction()
