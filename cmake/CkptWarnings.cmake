# ckpt_set_warnings(target): the project's warning set, applied per target rather than globally.
function(ckpt_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
                               -Wnon-virtual-dtor -Wold-style-cast -Woverloaded-virtual>
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra>)
endfunction()
